#include "common.hh"

static uint64_t own(uint64_t x) { return shared::step(x, 2) + shared::mix<uint32_t>(x, 2); }

int main(int argc, char **argv) {
  std::vector<uint64_t> v;
  uint64_t x = argc;
  for (int k = 0; k < 1000 * 2; k++) {
    x = own(shared::loop(x, k % 97));
    v.push_back(x);
  }
  x += shared::apply(v, [](uint64_t e) { return shared::step(e, 2); });
  std::printf("%s %llu\n", shared::label(argc).c_str(), (unsigned long long)x);
  return 0;
}
