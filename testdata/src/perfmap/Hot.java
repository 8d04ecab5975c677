// Hot is the perfmap package's Java fixture: it keeps one method hot so the
// JIT compiles it, then waits to be killed while the test asks the JVM for
// its perf map.
public class Hot {
    static volatile long sink;

    static long spin(long n) {
        long acc = 0;
        for (long i = 0; i < n; i++) {
            acc += i * 31 + (acc >>> 7);
        }
        return acc;
    }

    public static void main(String[] args) throws Exception {
        long deadline = System.nanoTime() + Long.parseLong(args.length > 0 ? args[0] : "60") * 1_000_000_000L;
        boolean announced = false;
        while (System.nanoTime() < deadline) {
            sink += spin(100_000);
            if (!announced) {
                System.out.println("started");
                System.out.flush();
                announced = true;
            }
        }
    }
}
