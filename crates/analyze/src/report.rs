//! Human-readable tables of a [`Report`], laid out like the papers' tables:
//! the inputs, Difference Engine's Table 1 (with patching), in-process versus
//! cross-process sharing, two-snapshot behaviour, Deng et al.'s Table 3, the
//! compression and chunking studies, the comparison counts, and a closing
//! summary of what each technique would save. JSON output ([`json`]) is the
//! same [`Report`] through serde, with its `"schema"`.

use std::fmt::Write;

use crate::sharing::Counts;
use crate::{Report, PAGE};

/// The `"schema"` of `pagefold analyze --json` (a [`Report`]).
pub const SCHEMA: &str = "pagefold-analyze/1";

/// `pagefold analyze --json`: the report as a JSON document, one line feed
/// at the end.
pub fn json(report: &Report) -> serde_json::Result<String> {
    Ok(pagefold_measure::schema::pretty(SCHEMA, report)? + "\n")
}

/// 1234567 -> "1,234,567".
pub fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

pub fn bytes(n: u64) -> String {
    let n = n as f64;
    if n >= (1u64 << 30) as f64 {
        format!("{:.2} GiB", n / (1u64 << 30) as f64)
    } else if n >= (1u64 << 20) as f64 {
        format!("{:.1} MiB", n / (1u64 << 20) as f64)
    } else {
        format!("{:.1} KiB", n / 1024.0)
    }
}

fn pct(part: u64, whole: u64) -> String {
    if whole == 0 {
        "-".into()
    } else {
        format!("{:.1}%", 100.0 * part as f64 / whole as f64)
    }
}

fn ns(x: f64) -> String {
    if !x.is_finite() {
        "-".into()
    } else if x >= 1e6 {
        format!("{:.2} ms", x / 1e6)
    } else if x >= 1e3 {
        format!("{:.1} us", x / 1e3)
    } else {
        format!("{:.0} ns", x)
    }
}

fn table1(out: &mut String, c: &Counts) {
    let _ = writeln!(
        out,
        "  {:<34}{:>14}{:>9}",
        "pages",
        thousands(c.pages),
        "100%"
    );
    let _ = writeln!(
        out,
        "  {:<34}{:>14}{:>9}",
        "  zero",
        thousands(c.zero_pages),
        pct(c.zero_pages, c.pages)
    );
    let _ = writeln!(
        out,
        "  {:<34}{:>14}{:>9}",
        format!("  sharable ({} distinct)", thousands(c.sharable_distinct)),
        thousands(c.sharable_pages),
        pct(c.sharable_pages, c.pages)
    );
    let _ = writeln!(
        out,
        "  {:<34}{:>14}{:>9}",
        "  unique",
        thousands(c.unique_pages),
        pct(c.unique_pages, c.pages)
    );
    let _ = writeln!(
        out,
        "  {:<34}{:>14}{:>9}",
        "after sharing",
        thousands(c.after_sharing),
        format!("-{}", pct(c.pages - c.after_sharing, c.pages))
    );
}

pub fn text(r: &Report) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "Inputs ({} pages, {}):",
        thousands(r.pages),
        bytes(r.bytes)
    );
    for i in &r.inputs {
        let mut extra = Vec::new();
        if i.unpopulated_pages > 0 {
            extra.push(format!(
                "{} unpopulated skipped",
                thousands(i.unpopulated_pages)
            ));
        }
        if i.vanished_pages > 0 {
            extra.push(format!(
                "{} vanished while read",
                thousands(i.vanished_pages)
            ));
        }
        if i.partial_bytes > 0 {
            extra.push(format!(
                "{} bytes of partial pages ignored",
                i.partial_bytes
            ));
        }
        if let Some(s) = &i.snapshot {
            extra.push(format!("second snapshot after {:.1} s", s.interval_seconds));
        }
        let _ = writeln!(
            o,
            "  {:<40} {:>6} {:>12} pages in {:>5} mappings, read in {:.2} s{}",
            i.name,
            i.source,
            thousands(i.pages as u64),
            i.mappings,
            i.read_seconds,
            if extra.is_empty() {
                String::new()
            } else {
                format!(" ({})", extra.join(", "))
            }
        );
    }

    if let Some(b) = &r.breakdown {
        let _ = writeln!(o, "\nSharing and patching (Difference Engine, Table 1):");
        table1(&mut o, &b.counts);
        if let Some(p) = &b.patching {
            let _ = writeln!(
                o,
                "  {:<34}{:>14}{:>9}",
                format!("  patchable ({}, c={})", p.detector, p.config.candidates),
                thousands(p.patched_pages),
                pct(p.patched_pages, b.counts.pages)
            );
            let _ = writeln!(
                o,
                "  {:<34}{:>14}",
                "  average patch (bytes)",
                format!("{:.0}", p.avg_patch_bytes)
            );
            let _ = writeln!(
                o,
                "  {:<34}{:>14}{:>9}",
                "after patching",
                thousands(p.after_patching),
                format!(
                    "-{}",
                    pct(
                        b.counts.pages - p.after_patching.min(b.counts.pages),
                        b.counts.pages
                    )
                )
            );
            let _ = writeln!(
                o,
                "  patches: {} ({}); {}-byte blocks at offsets {:?}; cut-off {} B; \
                 {} contents walked, {} kept as references, {} had candidates but no patch <= cut-off",
                p.config.encoder.name(),
                p.encoder_description,
                p.config.block,
                p.block_offsets,
                p.config.cutoff,
                thousands(p.contents),
                thousands(p.indexed_pages),
                thousands(p.rejected_pages),
            );
        }
        let _ = writeln!(
            o,
            "  scan + sharing{}: {:.3} s, {:.2} GB/s on {} threads, {:.3} s CPU ({} group members byte-compared, {} hash collisions)",
            if b.patching.is_some() { " + similarity" } else { "" },
            b.seconds,
            b.gb_per_s,
            r.threads,
            b.cpu_seconds,
            thousands(b.verify_compares),
            b.hash_collisions
        );
        if let Some(f) = &b.frames {
            let _ = writeln!(
                o,
                "  already shared physically: {} of {} pages sit on a frame mapped more than once ({} distinct frames)",
                thousands(f.pages_on_shared_frames),
                thousands(f.pages_with_frame),
                thousands(f.distinct_frames)
            );
        }
        if !b.per_input.is_empty() {
            let _ = writeln!(o, "\n  Per input (in-process sharing):");
            let _ = writeln!(
                o,
                "  {:<32}{:>11}{:>11}{:>11}{:>10}{:>11}{:>13}",
                "input", "pages", "zero", "sharable", "distinct", "unique", "after share"
            );
            for i in &b.per_input {
                let c = &i.counts;
                let _ = writeln!(
                    o,
                    "  {:<32}{:>11}{:>11}{:>11}{:>10}{:>11}{:>13}",
                    truncate(&i.input, 31),
                    thousands(c.pages),
                    thousands(c.zero_pages),
                    thousands(c.sharable_pages),
                    thousands(c.sharable_distinct),
                    thousands(c.unique_pages),
                    thousands(c.after_sharing)
                );
            }
        }
        if let Some(x) = &b.cross {
            let _ = writeln!(o, "\n  In-process vs cross-process sharing:");
            let _ = writeln!(
                o,
                "  after in-process sharing (pagefold)      {:>12}  (-{:.1}%)",
                thousands(x.after_in_process),
                x.in_process_saved_pct
            );
            let _ = writeln!(
                o,
                "  after cross-process sharing (KSM-like)   {:>12}  (-{:.1}%)",
                thousands(x.after_cross_process),
                x.cross_process_saved_pct
            );
            let _ = writeln!(
                o,
                "  cross-process merging adds               {:>12} pages",
                thousands(x.cross_adds_pages)
            );
        }
    }

    if let Some(rows) = &r.behaviour {
        let _ = writeln!(
            o,
            "\nBehaviour between the two snapshots (pages, by mapping permission):"
        );
        let _ = writeln!(
            o,
            "  {:<8}{:>12}{:>12}{:>12}{:>12}",
            "perms", "unchanged", "changed", "new", "gone"
        );
        for row in rows {
            let _ = writeln!(
                o,
                "  {:<8}{:>12}{:>12}{:>12}{:>12}",
                row.perms,
                thousands(row.unchanged),
                thousands(row.changed),
                thousands(row.new),
                thousands(row.gone)
            );
        }
    }

    if let Some(c) = &r.characterization {
        let _ = writeln!(o, "\nCharacterisation (Deng et al., Table 3):");
        let _ = writeln!(
            o,
            "  zero bytes                              {:>8.2}%",
            c.zero_bytes_pct
        );
        let _ = writeln!(
            o,
            "  bytes in zero runs > 32 B               {:>8.2}%",
            c.zero_bytes_in_long_runs_pct
        );
        let _ = writeln!(
            o,
            "  zero runs > 32 B touching a page edge   {:>8.2}%  (of {} such runs)",
            c.long_runs_touching_page_boundary_pct,
            thousands(c.long_runs)
        );
        let _ = writeln!(
            o,
            "  low values 1-9                          {:>8.2}%",
            c.low_values_1_9_pct
        );
        let _ = writeln!(
            o,
            "  powers of two                           {:>8.2}%",
            c.powers_of_two_pct
        );
        let _ = writeln!(
            o,
            "  zero-order entropy                      {:>8.3} bits/byte",
            c.entropy_bits_per_byte
        );
        let _ = writeln!(
            o,
            "  zero-run lengths (runs per length class, within pages):"
        );
        let mut buckets = [0u64; 13];
        for &(len, n) in &c.zero_run_lengths {
            let b = (32 - len.leading_zeros() - 1) as usize;
            buckets[b.min(12)] += n;
        }
        let mut line = String::from("   ");
        for (b, n) in buckets.iter().enumerate() {
            let label = if b == 12 {
                "4096".to_string()
            } else {
                format!("{}-{}", 1u32 << b, (1u32 << (b + 1)) - 1)
            };
            let _ = write!(line, " {label}:{}", thousands(*n));
        }
        let _ = writeln!(o, "{line}");
        let mut top: Vec<(usize, u64)> = c.byte_histogram.iter().copied().enumerate().collect();
        top.sort_by_key(|x| std::cmp::Reverse(x.1));
        let total: u64 = c.byte_histogram.iter().sum();
        let _ = writeln!(
            o,
            "  most frequent byte values: {}",
            top.iter()
                .take(8)
                .map(|(v, n)| format!("0x{v:02x} {}", pct(*n, total)))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }

    if let Some(cs) = &r.compression {
        let _ = writeln!(
            o,
            "\nCompression (size ratio compressed/original; time per 4 KiB page), sample: {}, {}:",
            cs.sample.description,
            bytes(cs.sample.sample_bytes)
        );
        let mut blocks: Vec<usize> = cs.rows.iter().map(|x| x.block).collect();
        blocks.sort_unstable();
        blocks.dedup();
        let mut codecs: Vec<String> = Vec::new();
        for row in &cs.rows {
            if !codecs.contains(&row.codec) {
                codecs.push(row.codec.clone());
            }
        }
        let mut head = format!("  {:<11}", "codec");
        for b in &blocks {
            let _ = write!(head, "{:>9}", format!("{}K", b / 1024));
        }
        let _ = write!(head, "   {:>10} {:>10}", "comp/page", "dec/page");
        let _ = writeln!(o, "{head}");
        for c in &codecs {
            let mut line = format!("  {:<11}", c);
            for b in &blocks {
                let cell = cs
                    .rows
                    .iter()
                    .find(|x| &x.codec == c && x.block == *b)
                    .map(|x| {
                        if x.ratio.is_finite() {
                            format!("{:.3}", x.ratio)
                        } else {
                            "error".into()
                        }
                    })
                    .unwrap_or_default();
                let _ = write!(line, "{cell:>9}");
            }
            if let Some(p) = cs.rows.iter().find(|x| &x.codec == c && x.block == PAGE) {
                let _ = write!(
                    line,
                    "   {:>10} {:>10}",
                    ns(p.compress_ns_per_page),
                    ns(p.decompress_ns_per_page)
                );
            }
            let _ = writeln!(o, "{line}");
        }
        for row in cs.rows.iter().filter(|x| x.error.is_some()) {
            let _ = writeln!(
                o,
                "  {} at {} B failed: {}",
                row.codec,
                row.block,
                row.error.as_deref().unwrap_or("")
            );
        }
    }

    if let Some(d) = &r.dedup {
        let _ = writeln!(o, "\nDeduplication by chunking (ratio stored/original, 8-byte chunk references counted), sample: {}, {}:", d.sample.description, bytes(d.sample.sample_bytes));
        let _ = writeln!(
            o,
            "  {:<10}{:>12}{:>12}{:>9}{:>13}{:>13}",
            "scheme", "chunks", "unique", "ratio", "dedup/page", "restore/page"
        );
        for row in &d.rows {
            let _ = writeln!(
                o,
                "  {:<10}{:>12}{:>12}{:>9.3}{:>13}{:>13}",
                row.scheme,
                thousands(row.chunks),
                thousands(row.unique_chunks),
                row.ratio,
                ns(row.dedup_ns_per_page),
                ns(row.restore_ns_per_page)
            );
        }
    }

    if let Some(c) = &r.comparisons {
        let _ = writeln!(
            o,
            "\nComparisons to find the duplicates (classes from {}; {} volatile pages):",
            c.classes_from,
            thousands(c.volatile_pages)
        );
        let _ = writeln!(
            o,
            "  {:<11}{:>14}{:>16}{:>14}{:>12}{:>12}{:>10}",
            "method", "page cmps", "bytes cmpd", "futile", "merged", "found", "of KSM"
        );
        for m in &c.methods {
            let _ = writeln!(
                o,
                "  {:<11}{:>14}{:>16}{:>14}{:>12}{:>11.1}%{:>9.1}%",
                m.name,
                thousands(m.cost.page_compares),
                thousands(m.cost.bytes_compared),
                thousands(m.cost.futile_compares),
                thousands(m.cost.pages_merged),
                m.sharing_found_pct,
                m.compares_pct_of_ksm
            );
        }
        let _ = writeln!(o, "  BMD classes:");
        for cl in &c.bmd_classes {
            let _ = writeln!(
                o,
                "    {:<26}{:>10} pages{:>14} cmps{:>12} futile{:>10} merged",
                cl.class,
                thousands(cl.cost.pages),
                thousands(cl.cost.page_compares),
                thousands(cl.cost.futile_compares),
                thousands(cl.cost.pages_merged)
            );
        }
    }

    if let Some(f) = &r.fingerprints {
        let _ = writeln!(
            o,
            "\nFingerprints (non-zero pages whose hash is a multiple of {}; --json lists them):",
            f.rate
        );
        for i in &f.inputs {
            let _ = writeln!(
                o,
                "  {:<40}{:>12} pages  {:>10} zero  {:>8} sampled  {:>8} distinct",
                truncate(&i.input, 40),
                thousands(i.pages),
                thousands(i.zero_pages),
                thousands(i.sampled_pages),
                thousands(i.sampled.len() as u64)
            );
        }
    }

    if !r.savings.is_empty() {
        let _ = writeln!(
            o,
            "\nWhat each technique would save ({} pages):",
            thousands(r.pages)
        );
        for s in &r.savings {
            let _ = writeln!(
                o,
                "  {:<42}{:>14} pages  -{:>5.1}%  ({})",
                s.technique,
                thousands(s.pages_after.round() as u64),
                s.saved_pct,
                s.basis
            );
        }
    }
    let _ = writeln!(
        o,
        "\nAnalysis took {:.2} s on {} threads.",
        r.seconds, r.threads
    );
    o
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(n - 1).collect();
        t.push('~');
        t
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn thousands_sep() {
        assert_eq!(super::thousands(0), "0");
        assert_eq!(super::thousands(999), "999");
        assert_eq!(super::thousands(1000), "1,000");
        assert_eq!(super::thousands(393120), "393,120");
        assert_eq!(super::thousands(1234567), "1,234,567");
    }
}
