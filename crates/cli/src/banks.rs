//! `pagefold banks`: how this machine maps physical addresses to DRAM banks,
//! as far as it can be known from here.
//!
//! It times row-buffer conflicts between address pairs (pagefold-banks'
//! probe); if the times split into two groups it solves for the bank
//! functions, otherwise it says that nothing was measured and falls back to
//! the table entry assumed for this CPU, named as an assumption. It also says
//! whether the PFNs it saw are real: inside a virtual machine they are the
//! guest's, and colouring by them cannot be checked against the memory
//! controller. `--json` prints the same as a document.

use pagefold_banks::machine::Machine;
use pagefold_banks::map::{self, BankMap, Source};
use pagefold_banks::probe::{self, Confidence, ProbeConfig, ProbeResult};
use serde::Serialize;

/// The `"schema"` of `pagefold banks --json`.
const SCHEMA: &str = "pagefold-banks/1";

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Print the findings as JSON.
    #[arg(long)]
    pub json: bool,
    /// Skip the timing probe (the table entry is used).
    #[arg(long)]
    pub no_probe: bool,
    /// Address pairs the probe times.
    #[arg(long, default_value_t = 2000)]
    pub candidates: usize,
    /// Timed rounds per pair (the median is kept).
    #[arg(long, default_value_t = 60)]
    pub rounds: usize,
    /// MiB of memory the probe draws its addresses from.
    #[arg(long, default_value_t = 256)]
    pub buffer_mib: usize,
}

/// Everything `pagefold banks` found.
#[derive(Serialize)]
struct Findings {
    machine: Machine,
    addresses_real: bool,
    probe: Option<ProbeSummary>,
    probe_error: Option<String>,
    map: BankMap,
    functions: Vec<String>,
    banks: u32,
    /// Bank pairs a 4 KiB page always covers together (functions using in-page bits).
    page_colours: u32,
    confidence: Confidence,
    why: String,
}

/// The probe's result without its samples.
#[derive(Serialize)]
struct ProbeSummary {
    pairs: usize,
    fast_cycles: u64,
    slow_cycles: Option<u64>,
    slow_share: f64,
    bimodal: bool,
    functions: Vec<String>,
    confidence: Confidence,
    reason: String,
    seconds: f64,
}

pub fn run(a: Args) -> i32 {
    if a.candidates == 0 || a.rounds == 0 || a.buffer_mib < 4 {
        eprintln!(
            "pagefold banks: --candidates and --rounds must be positive, --buffer-mib at least 4"
        );
        return 2;
    }
    let f = find(&a);
    if a.json {
        match pagefold_measure::schema::pretty(SCHEMA, &f) {
            Ok(s) => println!("{s}"),
            Err(e) => {
                eprintln!("pagefold banks: {e}");
                return 1;
            }
        }
    } else {
        print_human(&f);
    }
    0
}

fn find(a: &Args) -> Findings {
    let machine = Machine::probe();
    let (probe, probe_error) = if a.no_probe {
        (None, Some("skipped (--no-probe)".to_string()))
    } else {
        let cfg = ProbeConfig {
            buffer_mib: a.buffer_mib,
            candidates: a.candidates,
            rounds: a.rounds,
            ..ProbeConfig::default()
        };
        let start = std::time::Instant::now();
        match probe::run(&cfg) {
            Ok(r) => (Some(summary(&r, start.elapsed().as_secs_f64())), None),
            Err(e) => (None, Some(e.to_string())),
        }
    };
    let measured = probe
        .as_ref()
        .filter(|p| p.confidence == Confidence::High)
        .map(|p| p.functions.clone());
    let (map, confidence, why) = match (&probe, measured) {
        (Some(p), Some(_)) => (
            BankMap::new("measured", Source::Measured, probe_functions(p)),
            Confidence::High,
            p.reason.clone(),
        ),
        _ => {
            let (m, why) = map::assumed_for_this_cpu();
            (
                m,
                Confidence::None,
                format!("table entry ASSUMED, not measured: {why}"),
            )
        }
    };
    let in_page = map.page_banks(0).len();
    Findings {
        addresses_real: machine.addresses_real(),
        functions: map.describe(),
        banks: map.bank_count(),
        page_colours: map.bank_count() / in_page,
        machine,
        probe,
        probe_error,
        map,
        confidence,
        why,
    }
}

/// The probe's functions back as masks (they were kept as text for output).
fn probe_functions(p: &ProbeSummary) -> Vec<u64> {
    p.functions
        .iter()
        .map(|f| {
            f.trim_matches(|c| c == '(' || c == ')')
                .split(", ")
                .filter_map(|b| b.parse::<u32>().ok())
                .fold(0u64, |m, b| m | 1 << b)
        })
        .take(6)
        .collect()
}

fn summary(r: &ProbeResult, seconds: f64) -> ProbeSummary {
    ProbeSummary {
        pairs: r.samples.len(),
        fast_cycles: r.fast_cycles,
        slow_cycles: r.slow_cycles,
        slow_share: r.slow_share,
        bimodal: r.bimodal,
        functions: r.functions.iter().map(|&f| map::bits_of(f)).collect(),
        confidence: r.confidence,
        reason: r.reason.clone(),
        seconds,
    }
}

fn print_human(f: &Findings) {
    let m = &f.machine;
    println!(
        "cpu: {} (family {} model {:#x}){}",
        m.model_name,
        m.family,
        m.model,
        match (&m.hypervisor, &m.hypervisor_vendor) {
            (true, Some(v)) => format!(", under a hypervisor ({v})"),
            (true, None) => ", under a hypervisor".to_string(),
            _ => String::new(),
        }
    );
    let addresses = if !m.pfns_visible {
        "hidden (pagemap shows PFNs only to root): nothing can be measured or coloured"
    } else if m.hypervisor {
        "guest-physical: a virtual machine's PFNs, not the memory controller's; bank effects cannot be measured here"
    } else {
        "real (host-physical PFNs from pagemap)"
    };
    println!("physical addresses: {addresses}");
    match (&f.probe, &f.probe_error) {
        (Some(p), _) => {
            println!(
                "timing probe: {} pairs in {:.1} s; fast median {} cycles, slow median {}, {:.1}% slow; {}",
                p.pairs,
                p.seconds,
                p.fast_cycles,
                p.slow_cycles.map_or("-".to_string(), |s| s.to_string()),
                p.slow_share * 100.0,
                if p.bimodal { "two groups" } else { "no second group (no row-conflict signal)" }
            );
            println!("  {}", p.reason);
            if p.bimodal {
                println!(
                    "  functions found: {} (confidence {:?})",
                    p.functions.join(" "),
                    p.confidence
                );
            }
        }
        (None, Some(e)) => println!("timing probe: not run: {e}"),
        (None, None) => {}
    }
    println!(
        "bank map in use: {} ({})",
        f.map.name,
        match f.map.source {
            Source::Measured => "measured here",
            Source::Table => "from the table of published maps",
            Source::Given => "given",
        }
    );
    println!("  {} banks; functions {}", f.banks, f.functions.join(" "));
    println!(
        "  {} page colours (a 4 KiB page covers {} banks at once)",
        f.page_colours,
        f.banks / f.page_colours
    );
    println!("confidence: {:?}: {}", f.confidence, f.why);
}
