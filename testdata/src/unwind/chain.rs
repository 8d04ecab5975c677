// The chain in Rust, built in release mode (no frame pointers).
use std::time::Instant;

// std::hint::black_box is Rust 1.66+; a volatile read keeps the value
// opaque to the optimizer on the older rustc that cross-builds the arm64
// fixture (Debian's, with its packaged arm64 standard library).
#[inline(always)]
fn black_box<T: Copy>(x: T) -> T {
    unsafe { std::ptr::read_volatile(&x) }
}

#[inline(never)]
#[no_mangle]
pub fn leaf(n: u64) -> u64 {
    let mut x = n;
    for i in 0..200_000u64 {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(i ^ (x >> 13));
    }
    black_box(x)
}

#[inline(never)]
#[no_mangle]
pub fn d(n: u64) -> u64 { black_box(leaf(n + 1)).wrapping_mul(3) }
#[inline(never)]
#[no_mangle]
pub fn c(n: u64) -> u64 { black_box(d(n + 2)) ^ 5 }
#[inline(never)]
#[no_mangle]
pub fn b(n: u64) -> u64 { black_box(c(n + 3)).wrapping_add(7) }
#[inline(never)]
#[no_mangle]
pub fn a(n: u64) -> u64 { black_box(b(n + 4)).wrapping_sub(11) }

fn main() {
    let secs: f64 = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(2.0);
    let start = Instant::now();
    let mut sink = 0u64;
    let mut i = 0u64;
    // Wall time here: std has no process CPU clock; the tests allow for it.
    // The clock is read every 64 calls, as chain.h does.
    loop {
        sink = sink.wrapping_add(a(black_box(i)));
        i += 1;
        if i % 64 == 0 && start.elapsed().as_secs_f64() >= secs {
            break;
        }
    }
    black_box(sink);
}
