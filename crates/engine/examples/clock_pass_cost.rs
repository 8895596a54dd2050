//! What a clock pass costs against a plain scan (docs/MECHANISMS.md,
//! "Tiering policy"): 256 MiB written once, either random (incompressible)
//! or compressible, then eight scans, every one a clock pass when tiering is
//! on. Prints each scan's CPU time and what the policy did.
//!
//! `cargo run --release -p pagefold-engine --example clock_pass_cost`

use pagefold_engine::{Config, Engine, Hint, Tier, PAGE};
use std::time::Duration;

const PAGES: usize = 65536;

/// Fills the block: xorshift words, or words that LZ4 compresses well.
fn fill(p: *mut u8, random: bool) {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for k in 0..PAGES {
        for i in (0..PAGE).step_by(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let v = if random {
                x
            } else {
                (k as u64) << 20 | (i as u64 / 64)
            };
            // SAFETY: p is the block of PAGES * PAGE bytes from e.alloc in main (page-aligned,
            // so 8-byte aligned at every i, a multiple of 8); k < PAGES and i < PAGE keep the
            // word inside it.
            unsafe { (p.add(k * PAGE + i) as *mut u64).write(v) };
        }
    }
}

fn main() {
    for tier in [Tier::Off, Tier::On] {
        for random in [true, false] {
            let e = Engine::new(Config {
                tier,
                clock_interval: Duration::ZERO,
                ..Config::default()
            });
            let p = e.alloc(PAGES * PAGE, Hint::None);
            fill(p, random);
            let cpu_ms: Vec<u64> = (0..8).map(|_| e.scan().cpu_ns / 1_000_000).collect();
            let s = e.stats();
            let what = if random { "random" } else { "compressible" };
            println!(
                "tier={tier:?} {what}: scan CPU ms {cpu_ms:?}; evicted {}, refused {}",
                s.evicted, s.evict_refused
            );
            // SAFETY: p came from e.alloc above and is not used after this.
            unsafe { e.free(p) };
        }
    }
}
