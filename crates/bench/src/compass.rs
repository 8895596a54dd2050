//! The compass: the one comparison the product is steered by. On a workload
//! suite run with both `pagefold` and `ksm-10000` (kernel KSM at its most
//! aggressive setting here), pagefold must hold a smaller average footprint
//! than KSM while spending under a fifth of KSM's total CPU (the process
//! tree's plus ksmd's), both measured in the same invocation.
//!
//! "Total CPU" includes the program's own work, which both configurations
//! pay; so the section also shows the CPU each spends *beyond plain*, which is
//! what the mechanisms themselves cost. Both views are printed; the verdict
//! uses the total, as the target is worded.

use crate::stats::geomean;
pub use crate::suite_result::Compass;
use crate::suite_result::SuiteResult;

/// The configuration pagefold is compared with.
pub const KSM_AGGRESSIVE: &str = "ksm-10000";
/// pagefold's total CPU must stay below this fraction of KSM's.
pub const CPU_FRACTION: f64 = 0.2;

/// The compass of a suite result, if it ran both configurations.
pub fn of(r: &SuiteResult) -> Option<Compass> {
    let pf = r.configs.iter().position(|c| c == "pagefold")?;
    let ksm = r.configs.iter().position(|c| c == KSM_AGGRESSIVE)?;
    let plain = r.configs.iter().position(|c| c == "plain");
    let ratios: Vec<f64> = r
        .workloads
        .iter()
        .map(|w| w.stats[pf].average_mib.median / w.stats[ksm].average_mib.median)
        .collect();
    let cpu_sum = |i: usize| {
        r.workloads
            .iter()
            .map(|w| w.stats[i].cpu_s.median)
            .filter(|v| v.is_finite())
            .sum::<f64>()
    };
    let (pagefold_cpu_s, ksm_cpu_s) = (cpu_sum(pf), cpu_sum(ksm));
    let plain_cpu_s = plain.map(cpu_sum);
    let footprint_vs_ksm = geomean(&ratios);
    let cpu_vs_ksm = pagefold_cpu_s / ksm_cpu_s;
    Some(Compass {
        footprint_vs_ksm,
        workloads_below_ksm: ratios.iter().filter(|x| **x < 1.0).count(),
        workloads: ratios.len(),
        pagefold_cpu_s,
        ksm_cpu_s,
        plain_cpu_s,
        cpu_vs_ksm,
        extra_cpu_vs_ksm: plain_cpu_s.map(|p| (pagefold_cpu_s - p) / (ksm_cpu_s - p)),
        footprint_met: footprint_vs_ksm < 1.0,
        cpu_met: cpu_vs_ksm < CPU_FRACTION,
    })
}

/// The compass as a markdown paragraph; empty if the suite lacks a configuration.
pub fn markdown(r: &SuiteResult) -> String {
    let Some(c) = of(r) else { return String::new() };
    let verdict = |met: bool| if met { "MET" } else { "**MISSED**" };
    let extra = match (c.plain_cpu_s, c.extra_cpu_vs_ksm) {
        (Some(p), Some(x)) => format!(
            " Beyond plain's {p:.1} s, pagefold spends {:.1} s and KSM {:.1} s: pagefold's extra CPU is {x:.2}x KSM's.",
            c.pagefold_cpu_s - p,
            c.ksm_cpu_s - p
        ),
        _ => String::new(),
    };
    format!(
        "**Compass** (pagefold against `{KSM_AGGRESSIVE}`, same invocation)\n\n\
         - Average footprint: pagefold / KSM = {:.3} (geomean over {} workloads; pagefold below KSM on {} of them): {}.\n\
         - Total CPU (process tree + ksmd, summed over workloads): pagefold {:.1} s, KSM {:.1} s, ratio {:.2} \
         (target below {CPU_FRACTION}): {}.{extra}\n\n",
        c.footprint_vs_ksm,
        c.workloads,
        c.workloads_below_ksm,
        verdict(c.footprint_met),
        c.pagefold_cpu_s,
        c.ksm_cpu_s,
        c.cpu_vs_ksm,
        verdict(c.cpu_met),
    )
}
