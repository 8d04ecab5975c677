package e2e;

import java.io.File;
import java.io.IOException;
import java.io.RandomAccessFile;
import java.lang.management.ManagementFactory;
import java.lang.management.ThreadMXBean;

// Java fixture of the end-to-end runtime test (internal/e2e/runtimes_test.go):
// the built binaries must name main -> outer -> middle -> hotLoop, or with
// DEPTH main -> outer -> DEPTH x deep -> middle -> hotLoop. Compiled with
// javac --release 8 so that every JDK of the matrix runs it.
//
//   java -cp DIR e2e.JChain SECONDS GOFILE [DEPTH [virtual]]
//
// 1. warm: warm() runs the chain (outer, at least 20000 times) until GOFILE
//    exists (at most 60 s): past C2's threshold of 10000 calls, so that
//    under -XX:-TieredCompilation -Xbatch each method of the chain is
//    compiled before the measured work, and the sampler has attached the
//    JVM; the test watches the output for a named warm frame, then creates
//    GOFILE;
// 2. sleeps 0.2 s (off CPU), prints "go NS" (wall clock, ns) and calls
//    outer from main until the main thread has used SECONDS of CPU time (a
//    loaded machine makes the run longer, not the sample count smaller);
// 3. prints "done NS" and sleeps until killed.
//
// With "virtual" (JDK 21+), step 2's calls are made by run() on a virtual
// thread, which main starts (through reflection: the class file is Java 8's):
// run -> outer -> middle -> hotLoop above the JDK's frames that mount it
// (VirtualThread.run, Continuation.enter, ...) and its carrier's
// (ForkJoinWorkerThread.run). It never blocks, so it stays on one carrier,
// whose CPU time main counts (ThreadMXBean measures no virtual thread's);
// after "done" main prints "carrier TID", the carrier's thread id, whose
// samples the test counts. The carrier starts after 200 idle threads.
//
// The test counts the main thread's samples stamped from "go" to "done":
// their Java frames must be exactly hotLoop, middle, (DEPTH deep,) outer,
// main, leaf first, on the lines marked "// L:NAME". The CPU clock is read in main,
// after each call, and the calls are made to last 200 ms at least: with
// calls of 2 ms, 1% of the samples were in main and the clock's methods
// on the host, and with calls of 50 ms 1% in the emulated arm64 VM, where
// main runs interpreted and the clock's JNI path costs 0.5 ms.
public class JChain implements Runnable {
    static volatile long sink;
    static int depth;
    static double seconds;
    static final int IDLE_THREADS = 200;

    static long hotLoop(long n) {
        long s = 0; // L:hotLoop
        for (long i = 0; i < n; i++) { // L:hotLoop
            s += (i * 31) ^ (s >>> 7); // L:hotLoop
        }
        return s; // L:hotLoop
    }

    static long middle(long n) {
        long r = hotLoop(n); // L:middle
        return r + 1;
    }

    static long deep(int d, long n) {
        if (d > 1) {
            return deep(d - 1, n) + 1; // L:deep
        }
        return middle(n) + 1; // L:deep
    }

    static long outer(long n) {
        long r = depth > 0 ? deep(depth, n) : middle(n); // L:outer
        return r * 3;
    }

    static void warm(File go, long limit) {
        for (long calls = 0; calls < 20000 || !go.exists(); calls++) {
            if (System.nanoTime() > limit) {
                return;
            }
            sink += outer(1000);
        }
    }

    // The virtual thread's carrier (its thread id, once run has it), when
    // it began the chain (ns, wall clock) and when to stop.
    static volatile String carrier;
    static volatile long goNs;
    static volatile boolean stop;

    // Step 2 on a virtual thread: only the chain, until main says stop. Its
    // thread id is read first, through the file system, before main
    // prints "go": file I/O on a virtual thread goes through the
    // scheduler's compensation (Blocker), which in the emulated arm64 VM
    // took 2% of the samples when each call read the CPU clock here.
    public void run() {
        try {
            String self = new File("/proc/thread-self").getCanonicalPath(); // /proc/PID/task/TID
            carrier = self.substring(self.lastIndexOf('/') + 1);
        } catch (IOException e) {
            throw new RuntimeException(e);
        }
        // Its own "go" time, not main's: on a loaded machine main can
        // wait long for a CPU between reading the time and printing it.
        goNs = System.currentTimeMillis() * 1_000_000L;
        while (!stop) {
            sink += outer(20_000_000); // L:run
        }
    }

    // The CPU time, ns, of thread tid of this process.
    static long cpuOf(String tid) throws IOException {
        byte[] buf = new byte[64];
        int n;
        try (RandomAccessFile stat = new RandomAccessFile("/proc/self/task/" + tid + "/schedstat", "r")) {
            n = stat.read(buf);
        }
        long ns = 0;
        for (int i = 0; i < n && buf[i] >= '0' && buf[i] <= '9'; i++) {
            ns = ns * 10 + (buf[i] - '0');
        }
        return ns;
    }

    // Step 2 with "virtual": main starts vt, says "go" (its time) once it
    // runs the chain, watches its carrier's CPU time and, after SECONDS of
    // it (at least), says "done" (before the virtual thread ends: its
    // unmount is no part of the chain) and "carrier TID".
    static void runVirtual(Thread vt) throws Exception {
        vt.start();
        while (goNs == 0) {
            Thread.sleep(1);
        }
        long end = cpuOf(carrier) + (long) (seconds * 1e9);
        System.out.println("go " + goNs);
        System.out.flush();
        while (cpuOf(carrier) < end) {
            Thread.sleep(20);
        }
        long doneNs = System.currentTimeMillis() * 1_000_000L;
        stop = true;
        System.out.println("done " + doneNs);
        System.out.println("carrier " + carrier);
        System.out.flush();
        vt.join();
    }

    public static void main(String[] args) throws Exception {
        seconds = Double.parseDouble(args[0]);
        depth = args.length > 2 ? Integer.parseInt(args[2]) : 0;
        boolean virtual = args.length > 3 && args[3].equals("virtual");
        warm(new File(args[1]), System.nanoTime() + 60_000_000_000L);
        ThreadMXBean mx = ManagementFactory.getThreadMXBean();
        // The first println and the first CPU clock read load, link and
        // interpret their whole paths: 5-7 samples of arm64 C2's 305 in
        // the emulated VM when "go" was the first. Paid here, before it.
        System.err.println("warm " + System.currentTimeMillis() * 1_000_000L);
        System.err.flush();
        mx.getCurrentThreadCpuTime();
        Thread vt = null;
        if (virtual) {
            // Its carrier starts after 200 idle threads (issue 26: a
            // thread started after 200 others is walked like the first).
            for (int i = 0; i < IDLE_THREADS; i++) {
                Thread idle = new Thread(() -> {
                    try {
                        Thread.sleep(Long.MAX_VALUE);
                    } catch (InterruptedException e) {
                        // ends the thread
                    }
                });
                idle.setDaemon(true);
                idle.start();
            }
            Object builder = Thread.class.getMethod("ofVirtual").invoke(null);
            java.lang.reflect.Method unstarted = Class.forName("java.lang.Thread$Builder").getMethod("unstarted", Runnable.class);
            // A virtual thread that does nothing starts the scheduler's
            // carrier before "go": its start-up is no part of the chain.
            Runnable nothing = () -> { };
            Thread first = (Thread) unstarted.invoke(builder, nothing);
            first.start();
            first.join();
            vt = (Thread) unstarted.invoke(builder, new JChain());
        }
        Thread.sleep(200);
        if (vt != null) {
            runVirtual(vt);
            Thread.sleep(Long.MAX_VALUE);
        }
        System.out.println("go " + System.currentTimeMillis() * 1_000_000L);
        System.out.flush();
        long last = mx.getCurrentThreadCpuTime(), end = last + (long) (seconds * 1e9);
        long n = 20_000_000;
        while (last < end) {
            sink += outer(n); // L:main
            long now = mx.getCurrentThreadCpuTime();
            if (now - last < 200_000_000L) {
                n *= 2; // calls of 200 ms at least
            }
            last = now;
        }
        System.out.println("done " + System.currentTimeMillis() * 1_000_000L);
        System.out.flush();
        Thread.sleep(Long.MAX_VALUE);
    }
}
