// A native library for the remote-frame tests: lib_outer -> lib_mid ->
// lib_leaf, each recording where it is, so the test knows real PCs and
// return addresses inside a library the profiler would only see stripped.
#define NOINLINE __attribute__((noinline))

volatile int lib_sink;

NOINLINE void *lib_here(void) { return __builtin_return_address(0); }

NOINLINE void lib_leaf(void **out) {
    out[0] = lib_here();                   // a PC inside lib_leaf
    out[1] = __builtin_return_address(0);  // return address into lib_mid
    lib_sink++;
}

NOINLINE void lib_mid(void **out) {
    lib_leaf(out);
    out[2] = __builtin_return_address(0);  // return address into lib_outer
    lib_sink++;
}

NOINLINE void lib_outer(void **out) {
    lib_mid(out);
    out[3] = __builtin_return_address(0);  // return address into the caller
    lib_sink++;
}
