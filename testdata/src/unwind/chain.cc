// The chain in C++ -O2: the leaf works on a std::vector and every level goes
// through a template, so the frames are C++ code generation, not C's.
#include <vector>
#include "chain.h"

namespace chain {

template <int K> struct step {
	NOINLINE static unsigned long run(unsigned long n);
};

NOINLINE unsigned long leaf(unsigned long n)
{
	static std::vector<unsigned long> v(4096);
	unsigned long x = n;
	for (int r = 0; r < 40; r++)
		for (auto &e : v) {
			e = e * 6364136223846793005ul + (x ^ (e >> 13));
			x += e;
		}
	return x;
}

template <> NOINLINE unsigned long step<0>::run(unsigned long n) { return leaf(n + 1) * 3; }
template <int K> NOINLINE unsigned long step<K>::run(unsigned long n) { return step<K - 1>::run(n + K) ^ K; }
template struct step<2>;

} // namespace chain

// main -> a -> b -> c -> d -> step<2> -> step<1> -> step<0> -> leaf
extern "C" NOINLINE unsigned long d(unsigned long n) { return chain::step<2>::run(n) + 1; }
extern "C" NOINLINE unsigned long c(unsigned long n) { return d(n + 2) ^ 5; }
extern "C" NOINLINE unsigned long b(unsigned long n) { return c(n + 3) + 7; }
extern "C" NOINLINE unsigned long a(unsigned long n) { return b(n + 4) - 11; }

int main(int argc, char **argv)
{
	double secs = argc > 1 ? atof(argv[1]) : 2;
	return run_chain(secs, a, 63);
}
