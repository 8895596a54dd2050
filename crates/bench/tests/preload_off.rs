//! A configuration that switches the preload off costs what the program
//! costs alone: a real program (python3 touching 96 MiB and holding it) is
//! run plain and under `pagefold:PAGEFOLD_DISABLE=1` through the harness,
//! and the two peaks, sampled as every suite samples them, must agree within
//! the few pages the preload library's own code maps. The engine must not
//! have started (no exit report): a setting the preload does not read would
//! leave it running every mechanism, and every number of that configuration
//! would be pagefold's.

use std::path::Path;
use std::time::Duration;

use pagefold_bench::program::{parse_config, run, Invocation, Outcome};

/// Touches 96 MiB page by page, holds it for half a second, prints a checksum.
const HOLD: &str = r#"
import time
n = 96 << 20
b = bytearray(n)
for i in range(0, n, 4096):
    b[i] = (i >> 12) & 0xFF
time.sleep(0.5)
print(sum(b[::4096]))
"#;

/// Room for the preload library's own mapped pages and the sampler catching
/// the interpreter a moment earlier or later in its start-up.
const TOLERANCE_BYTES: u64 = 6 << 20;

fn run_as(config: &str, preload: &Path) -> Outcome {
    let cmd: Vec<String> = ["python3", "-c", HOLD].map(String::from).to_vec();
    let inv = Invocation {
        cmd: &cmd,
        preload,
        input: Some(&[]),
        interval: Duration::from_millis(10),
        timeout: Some(Duration::from_secs(60)),
    };
    let outcome = run(&inv, &parse_config(config).unwrap(), None).unwrap();
    assert_eq!(outcome.exit_code, 0, "{config}: {outcome:?}");
    outcome
}

#[test]
fn a_disabled_preload_peaks_where_the_program_alone_does() {
    let preload = pagefold_testkit::build_into(
        &pagefold_testkit::profile_dir(),
        &["pagefold-preload"],
        &["libpagefold_preload.so"],
    )
    .join("libpagefold_preload.so");
    let plain = run_as("plain", &preload);
    let off = run_as("pagefold:PAGEFOLD_DISABLE=1", &preload);
    assert_eq!(off.stdout, plain.stdout);
    assert!(
        off.engine.is_empty(),
        "the engine ran under PAGEFOLD_DISABLE=1: {:?}",
        off.engine
    );
    assert!(plain.peak_bytes > 96 << 20, "{plain:?}");
    assert!(
        plain.peak_bytes.abs_diff(off.peak_bytes) <= TOLERANCE_BYTES,
        "peak plain {} MiB, preload off {} MiB",
        plain.peak_bytes >> 20,
        off.peak_bytes >> 20
    );
}
