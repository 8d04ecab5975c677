// A workload with a known hot method for the JFR tests: Hot.spin burns CPU,
// called from Hot.work, called from Hot.main; Hot.cold runs a tenth as long.
public class Hot {
    static volatile long sink;

    static long spin(long n) {
        long x = 1;
        for (long i = 0; i < n; i++) {
            x = x * 6364136223846793005L + 1442695040888963407L;
            x ^= x >>> 29;
        }
        return x;
    }

    static long cold(long n) {
        long x = 7;
        for (long i = 0; i < n; i++) {
            x += (x << 3) ^ i;
        }
        return x;
    }

    static void work(long millis) {
        long end = System.currentTimeMillis() + millis;
        while (System.currentTimeMillis() < end) {
            sink += spin(2_000_000);
            sink += cold(200_000);
        }
    }

    public static void main(String[] args) throws Exception {
        long millis = args.length > 0 ? Long.parseLong(args[0]) : 3000;
        work(millis);
        System.out.println(sink == 42 ? "" : "done");
    }
}
