//! `cargo bench -p pagefold-tier --bench ops [-- --pages N --rounds N --swap-dir DIR --only PART]`:
//! the tier's op costs against Difference Engine's Table 2, and the codec,
//! encoder and store comparisons behind its defaults, as markdown.

use pagefold_tier::ops::{run, run_part, OpsConfig};

fn main() {
    let mut cfg = OpsConfig::default();
    let args: Vec<String> = std::env::args().collect();
    let mut only = None;
    let mut i = 1;
    while i < args.len() {
        let v = args.get(i + 1);
        match args[i].as_str() {
            "--pages" => cfg.pages = v.and_then(|v| v.parse().ok()).expect("--pages N"),
            "--rounds" => cfg.rounds = v.and_then(|v| v.parse().ok()).expect("--rounds N"),
            "--swap-dir" => cfg.swap_dir = v.expect("--swap-dir DIR").into(),
            "--only" => only = Some(v.expect("--only codecs|encoders|ops|store").clone()),
            _ => {
                i += 1;
                continue; // cargo's own flags (--bench)
            }
        }
        i += 2;
    }
    match only.as_deref() {
        None => print!("{}", run(&cfg)),
        Some(part) => print!("{}", run_part(&cfg, part)),
    }
}
