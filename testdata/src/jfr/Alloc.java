// An allocating workload for the JFR allocation tests: Alloc.churn makes
// many small arrays (allocated in TLABs), Alloc.big a few large ones
// (outside TLABs), both called from Alloc.main.
public class Alloc {
    static volatile Object sink;

    static void churn(int n) {
        for (int i = 0; i < n; i++) {
            sink = new byte[512 + (i & 1023)];
        }
    }

    static void big(int n) {
        for (int i = 0; i < n; i++) {
            sink = new long[64 * 1024];
        }
    }

    public static void main(String[] args) {
        long millis = args.length > 0 ? Long.parseLong(args[0]) : 2000;
        long end = System.currentTimeMillis() + millis;
        while (System.currentTimeMillis() < end) {
            churn(20_000);
            big(10);
        }
        System.out.println(sink == null ? "" : "done");
    }
}
