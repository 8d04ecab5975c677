// Shared by the three programs of the dwz fixture: what all of them
// include lands, after `dwz -m`, in the common file (types, the abstract
// instances of these inline functions and their names).
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace shared {

struct Acc {
  uint64_t sum = 0;
  inline void add(uint64_t v) {
    sum += v * 2654435761u;
    sum ^= sum >> 13;
  }
};

template <typename T> inline T mix(T a, T b) { return (a ^ (b << 7)) + (b >> 3); }

inline uint64_t step(uint64_t x, int i) {
  Acc a;
  a.add(x);
  a.add(i);
  return mix<uint64_t>(a.sum, x);
}

__attribute__((noinline)) inline uint64_t loop(uint64_t seed, int n) {
  uint64_t x = seed;
  for (int i = 0; i < n; i++)
    x = step(x, i);
  return x;
}

template <typename F> inline uint64_t apply(const std::vector<uint64_t> &v, F f) {
  uint64_t r = 0;
  for (uint64_t e : v)
    r = mix<uint64_t>(r, f(e));
  return r;
}

inline std::string label(int i) { return "v" + std::to_string(i); }

} // namespace shared
