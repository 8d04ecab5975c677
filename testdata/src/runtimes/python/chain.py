# Python fixture for the CPython walker (internal/host/runtimes/cpython):
# <module> -> top -> mid -> a busy function, directly or through C.
#
#   python3 chain.py MODE SECONDS [GOFILE]
#
# Deadlines are in CPU time (time.process_time), so that a loaded machine
# makes the run longer, not the sample count smaller.
#
# MODE chain:   top -> mid -> leaf
#      sorted:  top -> mid -> sorted(key=key)    (C calls back into Python)
#      ctypes:  top -> mid -> libc qsort(cmp)    (a ctypes callback)
#      deep:    top -> mid -> rec x 50 -> leaf
#      threads: three threads each run top -> mid -> leaf, started at the
#               first run and working until killed (the main thread waits)
#      dynamic: top -> mid -> dyn_N, a function compiled afresh every 10 ms
#               from "<dyn-N>" with its body on lines N+3 and N+4, freed
#               after its call (code objects come and go)
#
# It prints "lines {...}": for each function, the lines its code runs on
# as this interpreter's own tables say (dis.findlinestarts), so that the
# test checks the marked lines (# L:NAME) against the interpreter; then
# "warm" and works in short rounds until GOFILE exists (the test sees its
# Python frames: the sampler has met the process and read its files; at
# most 30 s; half a second without GOFILE), prints "go" before the work and
# "done" after it, and sleeps until killed, so that the samples the test
# keeps are of the work alone.
import ctypes
import dis
import json
import os
import sys
import threading
import time


def leaf(deadline):
    x = 0
    while True:
        for i in range(20000):  # L:leaf
            x += i * i  # L:leaf
        if time.process_time() > deadline:  # L:leaf
            return x  # L:leaf


def key(v):
    x = 0  # L:key
    for i in range(3000):  # L:key
        x += i * v  # L:key
    return x  # L:key


CMP = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int))
LIBC = ctypes.CDLL(None)
ARR = (ctypes.c_int * 64)(*range(64, 0, -1))


def cmp(a, b):
    x = 0  # L:cmp
    for i in range(3000):  # L:cmp
        x += i  # L:cmp
    return a[0] - b[0]  # L:cmp


CALLBACK = CMP(cmp)


def rec(n, deadline):
    if n > 1:
        return rec(n - 1, deadline)  # L:rec
    return leaf(deadline)  # L:rec


def dynamic(deadline):
    n = 0
    while time.process_time() < deadline:  # L:dynamic
        src = "\n" * n + f"def dyn_{n}(stop):\n    x = 0\n    while time.process_time() < stop:\n        x += 1\n    return x\n"  # L:dynamic
        ns = {"time": time}  # L:dynamic
        exec(compile(src, f"<dyn-{n}>", "exec"), ns)  # L:dynamic
        ns[f"dyn_{n}"](time.process_time() + 0.01)  # L:dynamic
        n += 1
    return n


def mid(mode, deadline):
    if mode in ("chain", "threads"):
        return leaf(deadline)  # L:mid-chain L:mid-threads
    if mode == "deep":
        return rec(50, deadline)  # L:mid-deep
    if mode == "dynamic":
        return dynamic(deadline)  # L:mid-dynamic
    if mode == "sorted":
        while time.process_time() < deadline:  # L:mid-sorted
            sorted(range(100), key=key)  # L:mid-sorted
        return 0
    while time.process_time() < deadline:  # L:mid-ctypes
        LIBC.qsort(ARR, len(ARR), ctypes.sizeof(ctypes.c_int), CALLBACK)  # L:mid-ctypes
    return 0


def top(mode, deadline):
    return mid(mode, deadline)  # L:top


def run(mode, deadline):
    if mode != "threads":
        return top(mode, deadline)  # L:run
    if not WORKERS:
        # Started once, before "go", and never stopped (the test kills the
        # process): the measured window holds the workers' steady state,
        # not their start or their end, which are threading.py's frames
        # or none.
        WORKERS.extend(threading.Thread(target=top, args=(mode, float("inf")), daemon=True) for _ in range(3))
        for t in WORKERS:
            t.start()
    while time.process_time() < deadline:
        time.sleep(0.01)


WORKERS = []


def lines(fn):
    return sorted({line for _, line in dis.findlinestarts(fn.__code__) if line})


mode, seconds = sys.argv[1], float(sys.argv[2])
gofile = sys.argv[3] if len(sys.argv) > 3 else None
print("lines " + json.dumps({f.__name__: lines(f) for f in (leaf, key, cmp, rec, dynamic, mid, top, run)}), flush=True)
print("warm", flush=True)
start = time.monotonic()
while time.monotonic() - start < (30 if gofile else 0.5) and not (gofile and os.path.exists(gofile)):
    run(mode, time.process_time() + 0.2)
print("go", flush=True)
run(mode, time.process_time() + seconds)  # L:module
print("done", flush=True)
time.sleep(3600)
