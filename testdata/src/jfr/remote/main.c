// Loads the libraries named on the command line, calls each one's
// lib_outer from exe_call, prints every recorded address ("LIB a0 a1 a2
// a3", hex), then waits for stdin to close so /proc/PID/maps can be read.
#include <dlfcn.h>
#include <stdio.h>

#define NOINLINE __attribute__((noinline))

volatile int exe_sink;

NOINLINE void exe_call(void (*fn)(void **), void **out) {
    fn(out);
    exe_sink++;
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        void *h = dlopen(argv[i], RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            fprintf(stderr, "%s\n", dlerror());
            return 1;
        }
        void (*fn)(void **) = (void (*)(void **))dlsym(h, "lib_outer");
        void *out[4] = {0};
        exe_call(fn, out);
        printf("%s %p %p %p %p\n", argv[i], out[0], out[1], out[2], out[3]);
    }
    fflush(stdout);
    while (getchar() != EOF) {
    }
    return 0;
}
