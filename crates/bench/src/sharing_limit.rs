//! What sharing could reach at best on each workload, and the share of it
//! each configuration captured.
//!
//! The `sharing-limit` configuration runs the program alone and samples,
//! besides its footprint, the footprint it would have if every all-zero
//! anonymous page were the kernel's zero page and every repeated anonymous
//! content shared one frame (pagefold_measure's limit.rs), at most twice a
//! second. Its ratio is limit over footprint of the same samples, so the
//! slowdown the sampling causes does not enter it. A configuration whose
//! average footprint is `r` of plain's captured
//!
//!   (1 - r) / (1 - limit)
//!
//! of what sharing could save: 100% is the limit reached, 0% plain's
//! footprint, a negative share a configuration larger than plain. Where the
//! limit is within `NOTHING_TO_SHARE` of the footprint there is too little to
//! capture, and only what a configuration costs shows (its ratio).

use crate::suite_result::SuiteResult;

/// The name of the configuration that samples the limit.
pub const CONFIG: &str = "sharing-limit";

/// A limit this close to the footprint (10%) leaves no share to speak of:
/// run-to-run noise of a few percent in the ratios would swing the share
/// by tens of percent.
pub const NOTHING_TO_SHARE: f64 = 0.10;

/// The share of the possible saving captured at `ratio` of plain's average
/// footprint, with the limit at `limit` of the footprint; None when there
/// is nothing to share or either is unknown.
pub fn captured(ratio: f64, limit: f64) -> Option<f64> {
    let possible = 1.0 - limit;
    (ratio.is_finite() && limit.is_finite() && possible >= NOTHING_TO_SHARE)
        .then(|| (1.0 - ratio) / possible)
}

/// The markdown table of limits and captured shares; empty unless the
/// `sharing-limit` configuration ran.
pub fn markdown(r: &SuiteResult) -> String {
    let Some(at) = r.configs.iter().position(|c| c == CONFIG) else {
        return String::new();
    };
    let others: Vec<usize> = (0..r.configs.len())
        .filter(|&i| i != at && r.configs[i] != "plain")
        .collect();
    let mut out = String::from(
        "**Sharing limit** (the `sharing-limit` configuration: the footprint with every zero page \
         folded and every repeated anonymous content on one frame, over the footprint of the same \
         samples; the run is slowed by the sampling, so its times above do not count). For each \
         other configuration: its average footprint over plain's, and the share of what sharing \
         could save that it captured, (1 - ratio) / (1 - limit).\n\n| workload | limit |",
    );
    for &i in &others {
        out += &format!(" {} | captured |", r.configs[i]);
    }
    out += "\n|---|---:|";
    out += &"---:|---:|".repeat(others.len());
    out.push('\n');
    let mut shares: Vec<Vec<f64>> = vec![Vec::new(); others.len()];
    for w in &r.workloads {
        let limit = w.stats[at].limit_ratio.median;
        out += &format!("| {} | {} |", w.name, fixed(limit));
        for (k, &i) in others.iter().enumerate() {
            let ratio = w.stats[i].average_ratio.median;
            let share = captured(ratio, limit);
            shares[k].extend(share);
            out += &format!(" {} | {} |", fixed(ratio), percent(share));
        }
        out.push('\n');
    }
    out += "| **mean of the shares** | |";
    for s in &shares {
        let mean = (!s.is_empty()).then(|| s.iter().sum::<f64>() / s.len() as f64);
        out += &format!(" | **{}** |", percent(mean));
    }
    out += "\n\n";
    out
}

fn fixed(v: f64) -> String {
    match v.is_finite() {
        true => format!("{v:.2}"),
        false => "-".into(),
    }
}

fn percent(share: Option<f64>) -> String {
    share.map_or("-".into(), |s| format!("{:.0}%", s * 100.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_share_runs_from_plain_to_the_limit() {
        assert_eq!(captured(1.0, 0.6), Some(0.0));
        assert!((captured(0.6, 0.6).unwrap() - 1.0).abs() < 1e-12);
        assert!((captured(0.8, 0.6).unwrap() - 0.5).abs() < 1e-12);
        assert!(captured(1.1, 0.6).unwrap() < 0.0, "larger than plain");
        assert_eq!(captured(0.9, 0.995), None, "nothing to share");
        assert_eq!(captured(f64::NAN, 0.5), None);
        assert_eq!(captured(0.5, f64::NAN), None);
    }
}
