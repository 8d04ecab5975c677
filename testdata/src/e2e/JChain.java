package e2e;

import java.io.File;
import java.lang.management.ManagementFactory;
import java.lang.management.ThreadMXBean;

// Java fixture of the end-to-end runtime test (internal/e2e/runtimes_test.go):
// the built binaries must name main -> outer -> middle -> hotLoop, or with
// DEPTH main -> outer -> DEPTH x deep -> middle -> hotLoop. Compiled with
// javac --release 8 so that every JDK of the matrix runs it.
//
//   java -cp DIR e2e.JChain SECONDS GOFILE [DEPTH]
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
// The test counts the main thread's samples stamped from "go" to "done":
// their Java frames must be exactly hotLoop, middle, (DEPTH deep,) outer,
// main, leaf first, on the lines marked "// L:NAME". The CPU clock is read in main,
// after each call, and the calls are made to last 200 ms at least: with
// calls of 2 ms, 1% of the samples were in main and the clock's methods
// on the host, and with calls of 50 ms 1% in the emulated arm64 VM, where
// main runs interpreted and the clock's JNI path costs 0.5 ms.
public class JChain {
    static volatile long sink;
    static int depth;

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

    public static void main(String[] args) throws Exception {
        double seconds = Double.parseDouble(args[0]);
        depth = args.length > 2 ? Integer.parseInt(args[2]) : 0;
        warm(new File(args[1]), System.nanoTime() + 60_000_000_000L);
        ThreadMXBean mx = ManagementFactory.getThreadMXBean();
        // The first println and the first CPU clock read load, link and
        // interpret their whole paths: 5-7 samples of arm64 C2's 305 in
        // the emulated VM when "go" was the first. Paid here, before it.
        System.err.println("warm " + System.currentTimeMillis() * 1_000_000L);
        System.err.flush();
        mx.getCurrentThreadCpuTime();
        Thread.sleep(200);
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
