#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace geo {
template <typename T> struct Point {
	T x, y;
	Point operator+(const Point &o) const { return {x + o.x, y + o.y}; }
	T dot(const Point &o) const { return x * o.x + y * o.y; }
};

template <typename T> class Path {
  public:
	void add(Point<T> p) { pts_.push_back(p); }
	T length2() const {
		T s = 0;
		for (size_t i = 1; i < pts_.size(); i++) {
			Point<T> d{pts_[i].x - pts_[i - 1].x, pts_[i].y - pts_[i - 1].y};
			s += d.dot(d);
		}
		return s;
	}
	template <typename F> void each(F f) const {
		for (const auto &p : pts_)
			f(p);
	}

  private:
	std::vector<Point<T>> pts_;
};

namespace detail {
inline int score(const std::string &s) {
	int h = 0;
	for (char c : s)
		h = h * 31 + c;
	return h;
}
} // namespace detail
} // namespace geo

struct Registry {
	std::map<std::string, int> counts;
	void bump(const std::string &k) { counts[k] += geo::detail::score(k) & 7; }
	virtual ~Registry() = default;
	virtual int total() const {
		int t = 0;
		for (auto &kv : counts)
			t += kv.second;
		return t;
	}
};

template <typename T> static T run(int n) {
	geo::Path<T> path;
	for (int i = 0; i < n; i++)
		path.add(geo::Point<T>{T(i), T(i * i % 7)} + geo::Point<T>{T(1), T(2)});
	T sum = 0;
	path.each([&sum](const geo::Point<T> &p) { sum += p.x > p.y ? p.x : p.y; });
	return sum + path.length2();
}

int main(int argc, char **argv) {
	Registry r;
	std::vector<std::string> words;
	for (int i = 0; i < argc; i++)
		words.emplace_back(argv[i]);
	std::sort(words.begin(), words.end(), [](const std::string &a, const std::string &b) {
		return geo::detail::score(a) < geo::detail::score(b);
	});
	for (auto &w : words)
		r.bump(w);
	std::function<double(int)> f = [](int n) { return run<double>(n); };
	std::printf("%d %ld %f\n", r.total(), (long)run<long>(argc * 10), f(argc));
	return 0;
}
