/* Blocks in known ways and measures, with its own clock, how long each
 * blocking call took: the truth the off-CPU tests compare profiles with.
 *
 *   wait sleep SECS        nanosleep 10 ms in a loop
 *   wait pipe SECS         read a pipe a child writes every 50 ms
 *   wait mutex SECS        two threads contend a mutex, each holding it
 *                          5 ms (asleep) at a time
 *   wait fsync SECS FILE   write 256 KiB to FILE and fsync, in a loop
 *   wait threads SECS N    N threads nanosleep 20 ms in a loop
 *   wait exec PROG ARGS... read a line from stdin, then exec PROG: a
 *                          process that changes its name when told
 *
 * Built -O2 -fomit-frame-pointer: the chain main -> loop_X -> wait_X -> libc
 * comes out whole only through unwind tables. At exit it prints one line
 * per thread and blocking call: "truth CALL TID NS CALLS", NS the time in
 * the call less the thread's CPU time in it: its time off CPU. With
 * WAIT_STOPPED set it stops itself first, until SIGCONT. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline, noclone))

static double secs = 3;
static volatile unsigned long sink;

static long long now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

static long long cpu_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

/* When a call began: wall and thread CPU time. */
struct mark {
	long long wall, cpu;
};

static struct mark mark(void)
{
	struct mark m = {now_ns(), cpu_ns()};
	return m;
}

struct truth {
	const char *call;
	long tid;
	long long ns, calls;
};

static struct truth truths[256];
static int ntruths;
static pthread_mutex_t truths_mu = PTHREAD_MUTEX_INITIALIZER;

static struct truth *truth_of(const char *call)
{
	long tid = syscall(SYS_gettid);
	pthread_mutex_lock(&truths_mu);
	for (int i = 0; i < ntruths; i++) {
		if (truths[i].tid == tid && strcmp(truths[i].call, call) == 0) {
			pthread_mutex_unlock(&truths_mu);
			return &truths[i];
		}
	}
	if (ntruths == sizeof(truths) / sizeof(truths[0]))
		exit(1);
	struct truth *t = &truths[ntruths++];
	t->call = call;
	t->tid = tid;
	pthread_mutex_unlock(&truths_mu);
	return t;
}

/* Adds the time off CPU since m to call's truth; the result keeps the
 * call from being a tail call. */
static long account(struct truth *t, struct mark m, long r)
{
	long long cpu = cpu_ns();
	t->ns += now_ns() - m.wall - (cpu - m.cpu);
	t->calls++;
	return r;
}

static long long deadline(void) { return now_ns() + (long long)(secs * 1e9); }

NOINLINE long wait_sleep(struct truth *t)
{
	struct timespec d = {0, 10 * 1000 * 1000};
	struct mark m = mark();
	return account(t, m, nanosleep(&d, NULL));
}

NOINLINE long loop_sleep(void)
{
	struct truth *t = truth_of("nanosleep");
	long long end = deadline();
	while (now_ns() < end)
		sink += wait_sleep(t) + 1;
	return sink;
}

NOINLINE long wait_pipe(struct truth *t, int fd)
{
	char c;
	struct mark m = mark();
	return account(t, m, read(fd, &c, 1));
}

NOINLINE long loop_pipe(void)
{
	int p[2];
	if (pipe(p))
		exit(1);
	pid_t child = fork();
	if (child == 0) {
		struct timespec d = {0, 50 * 1000 * 1000};
		close(p[0]);
		long long end = deadline();
		while (now_ns() < end) {
			nanosleep(&d, NULL);
			if (write(p[1], "x", 1) != 1)
				_exit(1);
		}
		_exit(0);
	}
	close(p[1]);
	struct truth *t = truth_of("read");
	while (wait_pipe(t, p[0]) == 1)
		sink++;
	/* The last read saw the child's end of the pipe close: not a wait
	 * for data, but it blocked like the others. */
	return sink;
}

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

NOINLINE long wait_mutex(struct truth *t)
{
	struct mark m = mark();
	return account(t, m, pthread_mutex_lock(&mu));
}

NOINLINE long hold_mutex(struct truth *t)
{
	struct timespec d = {0, 5 * 1000 * 1000};
	struct mark m = mark();
	return account(t, m, nanosleep(&d, NULL));
}

NOINLINE long loop_mutex(void)
{
	struct truth *lock = truth_of("pthread_mutex_lock"), *hold = truth_of("nanosleep");
	long long end = deadline();
	while (now_ns() < end) {
		sink += wait_mutex(lock);
		sink += hold_mutex(hold);
		pthread_mutex_unlock(&mu);
	}
	return sink;
}

static void *mutex_thread(void *arg)
{
	(void)arg;
	sink += loop_mutex();
	return NULL;
}

static char block[256 << 10];

NOINLINE long wait_fsync(struct truth *t, int fd)
{
	struct mark m = mark();
	return account(t, m, fsync(fd));
}

NOINLINE long loop_fsync(const char *path)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	if (fd < 0)
		exit(1);
	struct truth *t = truth_of("fsync");
	long long end = deadline();
	memset(block, 'x', sizeof(block));
	while (now_ns() < end) {
		if (pwrite(fd, block, sizeof(block), 0) != sizeof(block))
			exit(1);
		sink += wait_fsync(t, fd);
	}
	close(fd);
	unlink(path);
	return sink;
}

NOINLINE long nap_thread(struct truth *t)
{
	struct timespec d = {0, 20 * 1000 * 1000};
	struct mark m = mark();
	return account(t, m, nanosleep(&d, NULL));
}

static void *napper(void *arg)
{
	struct truth *t = truth_of("nanosleep");
	long long end = deadline();
	(void)arg;
	while (now_ns() < end)
		sink += nap_thread(t) + 1;
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: wait sleep|pipe|mutex|fsync|threads SECS [FILE|N] | exec PROG ARGS...\n");
		return 2;
	}
	if (strcmp(argv[1], "exec") == 0) {
		char line[16];

		if (!fgets(line, sizeof line, stdin))
			return 2;
		execv(argv[2], argv + 2);
		return 2;
	}
	secs = atof(argv[2]);
	/* Under WAIT_STOPPED=1 it stops itself until the test, which knows its
	 * pid now, has its peers attached (SIGCONT). */
	if (getenv("WAIT_STOPPED"))
		raise(SIGSTOP);
	if (strcmp(argv[1], "sleep") == 0) {
		sink += loop_sleep();
	} else if (strcmp(argv[1], "pipe") == 0) {
		sink += loop_pipe();
	} else if (strcmp(argv[1], "mutex") == 0) {
		pthread_t th;
		pthread_create(&th, NULL, mutex_thread, NULL);
		sink += loop_mutex();
		pthread_join(th, NULL);
	} else if (strcmp(argv[1], "fsync") == 0 && argc > 3) {
		sink += loop_fsync(argv[3]);
	} else if (strcmp(argv[1], "threads") == 0 && argc > 3) {
		int n = atoi(argv[3]);
		pthread_t th[200];
		if (n < 1 || n > 200)
			return 2;
		for (int i = 0; i < n; i++)
			pthread_create(&th[i], NULL, napper, NULL);
		for (int i = 0; i < n; i++)
			pthread_join(th[i], NULL);
	} else {
		return 2;
	}
	for (int i = 0; i < ntruths; i++)
		printf("truth %s %ld %lld %lld\n", truths[i].call, truths[i].tid, truths[i].ns, truths[i].calls);
	return sink == 42; /* never: keeps sink live */
}
