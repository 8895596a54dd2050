//! Writes 256 pages of a kind to a file (for probes in other languages):
//! `cargo run --release -p pagefold-tier --example dump_pages -- text FILE`.
use pagefold_tier::kinds::{page, Kind};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let kind = Kind::ALL
        .into_iter()
        .find(|k| k.name() == args[1])
        .expect("kind");
    let data: Vec<u8> = (1..=256u64).flat_map(|s| page(kind, s)).collect();
    std::fs::write(&args[2], data).expect("write");
}
