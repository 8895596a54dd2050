//! Profiles one scan of 1 GiB of unique pages: `cargo run --release --example scanprof [zero]`.
use pagefold_engine::{Config, Engine, Hint, PAGE};
fn main() {
    let zero = std::env::args().nth(1).as_deref() == Some("zero");
    let n = 262144;
    let e = Engine::new(Config::default());
    let p = e.alloc(n * PAGE, Hint::FullWrite);
    if !zero {
        for i in 0..n {
            // SAFETY: p is a block of n * PAGE bytes from e.alloc (page-aligned, so
            // u64-aligned), i < n, and no other reference to page i exists while w lives.
            let w =
                unsafe { std::slice::from_raw_parts_mut(p.add(i * PAGE) as *mut u64, PAGE / 8) };
            for (j, x) in w.iter_mut().enumerate() {
                *x = (i as u64) << 20 | j as u64;
            }
        }
    }
    for _ in 0..3 {
        let r = e.scan();
        println!(
            "{:?} GB/s per core {:.2}",
            r,
            (n * PAGE) as f64 / r.cpu_ns as f64
        );
    }
}
