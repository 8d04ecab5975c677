# Python fixture of the end-to-end runtime test (internal/e2e/runtimes_test.go):
# the built binaries must name <module> -> top -> mid -> leaf, or with DEPTH
# <module> -> top -> mid -> DEPTH x rec -> leaf.
#
#   python3 pychain.py SECONDS GOFILE [THREADS [DEPTH]]
#
# 0. starts THREADS idle threads (default 0), blocked for good: the main
#    thread, the one that works, is then the last of the interpreter's
#    thread list (newest first), which the walker must reach like the first;
# 1. warm: half busy in warm() (a function of its own) until GOFILE exists
#    (at most 60 s), so that the sampler has met the process and attached
#    its interpreter before the measured work; the test watches the output
#    for a named warm frame, or waits, then creates GOFILE;
# 2. sleeps 0.2 s (off CPU: no sample is stamped near the switch), prints
#    "go NS" (time.time_ns()) and runs top -> mid -> leaf for SECONDS of CPU
#    time (process_time: a loaded machine makes the run longer, not the
#    sample count smaller);
# 3. prints "done NS" and sleeps until killed (no samples after the work).
#
# The test counts the samples stamped at or after "go": each of them must
# have exactly leaf, (DEPTH rec,) mid, top, <module> as its Python frames,
# leaf first, on the lines marked "# L:NAME".
import os
import sys
import threading
import time


def warm(gofile, limit):
    s = ""
    while not os.path.exists(gofile) and time.monotonic() < limit:
        busy = time.monotonic() + 0.01
        while time.monotonic() < busy:
            for i in range(200):
                s = str(i) + s[:64]
        time.sleep(0.01)
    return s


def leaf(deadline):
    x = 0
    while True:  # L:leaf (3.11+: the outer loop's JUMP_BACKWARD)
        for i in range(20000):  # L:leaf
            x += i * i  # L:leaf
        if time.process_time() > deadline:  # L:leaf
            return x  # L:leaf


def rec(n, deadline):
    if n > 1:
        return rec(n - 1, deadline)  # L:rec
    return leaf(deadline)  # L:rec


def mid(deadline, depth):
    if depth:
        return rec(depth, deadline)  # L:mid
    return leaf(deadline)  # L:mid


def top(deadline, depth):
    return mid(deadline, depth)  # L:top


# 3.6 has no time_ns.
time_ns = getattr(time, "time_ns", None) or (lambda: int(time.time() * 1e9))
seconds, gofile = float(sys.argv[1]), sys.argv[2]
depth = int(sys.argv[4]) if len(sys.argv) > 4 else 0
idle = threading.Event()
for _ in range(int(sys.argv[3]) if len(sys.argv) > 3 else 0):
    threading.Thread(target=idle.wait, daemon=True).start()
warm(gofile, time.monotonic() + 60)
time.sleep(0.2)
print("go", time_ns(), flush=True)
top(time.process_time() + seconds, depth)  # L:<module>
print("done", time_ns(), flush=True)
while True:
    time.sleep(3600)
