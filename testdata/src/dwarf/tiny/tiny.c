/* Smallest useful DWARF: one unit, an inline chain, a loop. Its sections
 * seed the fuzzer, which explores small inputs far faster. */
static inline int leaf(int x) { return x * 7 + 1; }
static inline __attribute__((always_inline)) int mid(int x) { return leaf(x) ^ leaf(x >> 1); }
int tiny(int n) {
	int s = 0;
	for (int i = 0; i < n; i++)
		s += mid(i);
	return s;
}
