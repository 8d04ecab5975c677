# Python fixture for the CPython walker (internal/host/runtimes/cpython):
# <module> -> top -> mid -> a busy function, directly or through C.
#
#   python3 chain.py MODE SECONDS
#
# MODE chain:  top -> mid -> leaf
#      sorted: top -> mid -> sorted(key=key)     (C calls back into Python)
#      ctypes: top -> mid -> libc qsort(cmp)     (a ctypes callback)
#
# It prints "lines {...}": for each function, the lines its code runs on
# as this interpreter's own tables say (dis.findlinestarts), so that the
# test checks the marked lines (# L:NAME) against the interpreter; then
# works for half a second (the sampler meets the process and reads its
# files), prints "go" before the work and "done" after it, and sleeps
# until killed, so that the samples the test keeps are of the work alone.
import ctypes
import dis
import json
import sys
import time


def leaf(deadline):
    x = 0
    while True:
        for i in range(20000):  # L:leaf
            x += i * i  # L:leaf
        if time.monotonic() > deadline:  # L:leaf
            return x  # L:leaf


def key(v):
    x = 0
    for i in range(3000):  # L:key
        x += i * v  # L:key
    return x  # L:key


CMP = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int))
LIBC = ctypes.CDLL(None)
ARR = (ctypes.c_int * 64)(*range(64, 0, -1))


def cmp(a, b):
    x = 0
    for i in range(3000):  # L:cmp
        x += i  # L:cmp
    return a[0] - b[0]  # L:cmp


CALLBACK = CMP(cmp)


def mid(mode, deadline):
    if mode == "chain":
        return leaf(deadline)  # L:mid-chain
    if mode == "sorted":
        while time.monotonic() < deadline:  # L:mid-sorted
            sorted(range(100), key=key)  # L:mid-sorted
        return 0
    while time.monotonic() < deadline:  # L:mid-ctypes
        LIBC.qsort(ARR, len(ARR), ctypes.sizeof(ctypes.c_int), CALLBACK)  # L:mid-ctypes
    return 0


def top(mode, deadline):
    return mid(mode, deadline)  # L:top


def lines(fn):
    return sorted({line for _, line in dis.findlinestarts(fn.__code__) if line})


mode, seconds = sys.argv[1], float(sys.argv[2])
print("lines " + json.dumps({f.__name__: lines(f) for f in (leaf, key, cmp, mid, top)}), flush=True)
top(mode, time.monotonic() + 0.5)  # L:module
print("go", flush=True)
top(mode, time.monotonic() + seconds)  # L:module
print("done", flush=True)
time.sleep(3600)
