#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

namespace geo {
template <typename T>
struct Vec2 {
	T x, y;
	Vec2 operator+(const Vec2 &o) const { return {x + o.x, y + o.y}; }
	T dot(const Vec2 &o) const { return x * o.x + y * o.y; }
};

class Shape {
public:
	virtual ~Shape() = default;
	virtual double area() const = 0;
};

class Poly : public Shape {
public:
	explicit Poly(std::vector<Vec2<double>> pts) : pts_(std::move(pts)) {}
	double area() const override {
		double a = 0;
		for (size_t i = 0; i < pts_.size(); i++) {
			const auto &p = pts_[i], &q = pts_[(i + 1) % pts_.size()];
			a += p.x * q.y - q.x * p.y;
		}
		return a / 2;
	}

private:
	std::vector<Vec2<double>> pts_;
};
} // namespace geo

namespace {
template <typename C, typename F>
auto fold(const C &c, F f) {
	typename C::value_type acc{};
	for (const auto &v : c)
		acc = f(acc, v);
	return acc;
}

std::map<std::string, int> count_words(const std::vector<std::string> &ws) {
	std::map<std::string, int> m;
	for (const auto &w : ws)
		m[w]++;
	return m;
}
} // namespace

__attribute__((noinline)) double work(int n) {
	std::vector<int> v(n);
	std::iota(v.begin(), v.end(), 1);
	std::sort(v.begin(), v.end(), [](int a, int b) { return (a * 7919) % 101 < (b * 7919) % 101; });
	int s = fold(v, [](int a, int b) { return a + b % 13; });
	std::vector<std::unique_ptr<geo::Shape>> shapes;
	for (int i = 1; i < 20; i++)
		shapes.push_back(std::make_unique<geo::Poly>(std::vector<geo::Vec2<double>>{{0, 0}, {double(i), 0}, {0, double(i)}}));
	double area = 0;
	for (const auto &sh : shapes)
		area += sh->area();
	geo::Vec2<int> a{1, 2}, b{3, 4};
	auto wc = count_words({"a", "b", "a", std::to_string(s)});
	std::function<int(int)> f = [&](int x) { return x + (a + b).dot(b) + int(wc.size()); };
	return area + f(s);
}

int main(int argc, char **) { std::printf("%f\n", work(1000 + argc)); }
