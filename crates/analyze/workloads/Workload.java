// A JVM holding a hash map of records and arrays, churning a little every
// 100 ms. Prints its PID. Used by docs/ANALYSIS.md:
// `java -Xmx1g workloads/Workload.java [N]`.
import java.util.*;

public class Workload {
    record Rec(int id, String name, double value, int[] tags) {}

    public static void main(String[] args) throws Exception {
        int n = args.length > 0 ? Integer.parseInt(args[0]) : 1_500_000;
        Random r = new Random(1);
        Map<Integer, Rec> map = new HashMap<>();
        for (int i = 0; i < n; i++) {
            map.put(i, new Rec(i, "item-" + (i % 10000), r.nextDouble(), new int[] {i % 7, i % 11, 0, 0}));
        }
        long[] zeros = new long[16 << 20];           // 128 MiB, zeroed by the JVM
        double[] samples = new double[8 << 20];
        for (int i = 0; i < samples.length; i++) samples[i] = r.nextGaussian();
        double[] copy = samples.clone();
        System.out.println(ProcessHandle.current().pid());
        System.out.flush();
        long sum = 0;
        while (true) {
            for (int i = 0; i < 10000; i++) map.get(r.nextInt(n)).tags()[2]++;
            sum += zeros[r.nextInt(zeros.length)] + (long) copy[0];
            Thread.sleep(100);
        }
    }
}
