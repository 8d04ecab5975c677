use std::collections::HashMap;

mod shapes {
    pub trait Area {
        fn area(&self) -> f64;
    }
    pub struct Rect<T> {
        pub w: T,
        pub h: T,
    }
    impl Area for Rect<f64> {
        #[inline]
        fn area(&self) -> f64 {
            self.w * self.h
        }
    }
    impl<T: Copy + Into<f64>> Rect<T> {
        #[inline(never)]
        pub fn scaled(&self, k: f64) -> f64 {
            self.w.into() * self.h.into() * k
        }
    }
}

use shapes::Area;

#[inline]
fn weigh(x: u64) -> u64 {
    if x % 3 == 0 { x * 2 } else { x + 1 }
}

#[inline(never)]
fn hot(n: u64) -> u64 {
    let mut v: Vec<u64> = (0..n).map(|i| (i * 7919) % 1009).collect();
    v.sort_unstable();
    let mut m: HashMap<u64, u64> = HashMap::new();
    for x in &v {
        *m.entry(x % 17).or_insert(0) += weigh(*x);
    }
    m.values().copied().sum()
}

fn main() {
    let n: u64 = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(1000);
    let r = shapes::Rect { w: 2.0f64, h: 3.0 };
    let q = shapes::Rect { w: 2u8, h: 5u8 };
    println!("{} {} {}", hot(n), r.area(), q.scaled(1.5));
}
