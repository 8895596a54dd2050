//! `pagefold doctor [--json]`: what of pagefold works on this machine for
//! this user, and why. Each check reads one kernel facility the engine or
//! the measurements rely on (userfaultfd and the features the engine asks
//! of it, memfd, PFNs in pagemap, transparent huge pages, KSM, the cgroup's
//! memory limit, `vm.max_map_count`); a missing one names the mechanisms it
//! takes away and the command an administrator runs to bring it back.
//!
//! The checks honour the engine's `PAGEFOLD_INJECT_*` variables, so a
//! refusal forced for a test reads here as the real one would. `pagefold
//! run` asks the same checks before it starts a program and prints one
//! line when the engine will run without mechanisms it has by default
//! ([`degraded_warning`]).

use pagefold_engine::protect::{self, Probe};
use pagefold_engine::{Config, Inject};
use serde::Serialize;

/// The `"schema"` of `pagefold doctor --json`.
pub const SCHEMA: &str = "pagefold-doctor/1";

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

/// What a missing check takes away.
const COPIES: &str = "virtual copies";
const ZERO: &str = "zero folding";
const MERGE: &str = "merging";
const EVICT: &str = "eviction and tiering";
const PIN_GUARD: &str = "pin guard";
const POISON: &str = "poisoned pages for lost stored copies";
const FOOTPRINT: &str = "true footprint (distinct physical pages)";
const COLOUR: &str = "page colouring";
const KSM: &str = "KSM delegation";
/// Every mechanism the report says works or not, in this order.
const MECHANISMS: [&str; 9] = [
    COPIES, ZERO, MERGE, EVICT, PIN_GUARD, POISON, FOOTPRINT, COLOUR, KSM,
];
/// What needs a userfaultfd.
const PROTECTED: [&str; 5] = [ZERO, MERGE, EVICT, PIN_GUARD, POISON];

/// One facility and what was found.
#[derive(Serialize, Debug)]
pub struct Check {
    pub name: &'static str,
    /// It works (or, for the facts only shown, it was read).
    pub ok: bool,
    /// What was found, in words.
    pub state: String,
    /// Mechanisms lost while it is missing (empty when nothing is lost).
    pub lost: Vec<&'static str>,
    /// What an administrator runs (or installs) to bring it back.
    pub fix: Option<String>,
}

/// Whether a mechanism works, and if not, which checks it misses.
#[derive(Serialize, Debug)]
pub struct Mechanism {
    pub name: &'static str,
    pub works: bool,
    pub missing: Vec<&'static str>,
}

#[derive(Serialize, Debug)]
pub struct Report {
    pub kernel: String,
    pub uid: u32,
    pub user: String,
    pub checks: Vec<Check>,
    pub mechanisms: Vec<Mechanism>,
}

pub fn run(a: Args) -> i32 {
    let report = examine(&Config::from_env());
    let text = if a.json {
        match pagefold_measure::schema::pretty(SCHEMA, &report) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("pagefold doctor: {e}");
                return 1;
            }
        }
    } else {
        table(&report)
    };
    println!("{text}");
    0
}

/// Every check, under `cfg`'s injected refusals.
pub fn examine(cfg: &Config) -> Report {
    let inject = &cfg.inject;
    let (uid, user) = whoami();
    let mut checks = vec![kernel_check()];
    checks.extend(uffd_checks(inject, &user));
    checks.push(memfd_check(inject));
    checks.push(pfn_check(inject));
    checks.push(thp_check());
    checks.push(ksm_check(cfg));
    checks.push(cgroup_check(cfg));
    checks.push(max_map_check(cfg));
    let mechanisms = MECHANISMS
        .iter()
        .map(|&name| {
            let missing: Vec<_> = checks
                .iter()
                .filter(|c| c.lost.contains(&name))
                .map(|c| c.name)
                .collect();
            Mechanism {
                name,
                works: missing.is_empty(),
                missing,
            }
        })
        .collect();
    Report {
        kernel: kernel_release(),
        uid,
        user,
        checks,
        mechanisms,
    }
}

/// The line `pagefold run` prints when the engine will miss a mechanism it
/// has by default (eviction counts with tiering on); None when nothing is.
pub fn degraded_warning(cfg: &Config) -> Option<String> {
    let report = examine(cfg);
    let wanted: Vec<&str> = [
        (COPIES, cfg.frames && cfg.copy),
        (ZERO, cfg.zero),
        (MERGE, cfg.merge),
        (PIN_GUARD, cfg.pin_guard),
        (EVICT, cfg.tier != pagefold_engine::Tier::Off),
        (KSM, cfg.ksm_handoff),
    ]
    .into_iter()
    .filter_map(|(name, on)| on.then_some(name))
    .collect();
    let lost: Vec<&Mechanism> = report
        .mechanisms
        .iter()
        .filter(|m| !m.works && wanted.contains(&m.name))
        .collect();
    if lost.is_empty() {
        return None;
    }
    let names: Vec<&str> = lost.iter().map(|m| m.name).collect();
    let mut why: Vec<&str> = Vec::new();
    for name in lost.iter().flat_map(|m| m.missing.iter()) {
        if !why.contains(name) {
            why.push(name);
        }
    }
    Some(format!(
        "pagefold run: running without {} (missing: {}); `pagefold doctor` says how to enable it",
        names.join(", "),
        why.join(", ")
    ))
}

fn check(name: &'static str, ok: bool, state: String) -> Check {
    Check {
        name,
        ok,
        state,
        lost: Vec::new(),
        fix: None,
    }
}

impl Check {
    /// Marks the check missing: `lost` goes with it, `fix` brings it back.
    fn missing(mut self, lost: &[&'static str], fix: &str) -> Check {
        self.ok = false;
        self.lost = lost.to_vec();
        self.fix = Some(fix.to_string());
        self
    }
}

fn kernel_release() -> String {
    // SAFETY: utsname is plain old data; zeroed is a valid value for uname to fill in.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: u is a live utsname that uname fills in.
    if unsafe { libc::uname(&mut u) } != 0 {
        return "unknown".into();
    }
    // SAFETY: uname leaves a NUL-terminated string in release.
    let release = unsafe { std::ffi::CStr::from_ptr(u.release.as_ptr()) };
    release.to_string_lossy().into_owned()
}

fn kernel_check() -> Check {
    check("kernel", true, format!("Linux {}", kernel_release()))
}

/// This process's real uid and its user name.
fn whoami() -> (u32, String) {
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    (uid, id_name("/etc/passwd", uid))
}

/// The name of user or group `id` in `file` (/etc/passwd, /etc/group); the
/// number where it has none there.
fn id_name(file: &str, id: u32) -> String {
    let id = id.to_string();
    std::fs::read_to_string(file)
        .ok()
        .and_then(|p| {
            p.lines().find_map(|l| {
                let f: Vec<&str> = l.split(':').collect();
                (f.len() > 2 && f[2] == id).then(|| f[0].to_string())
            })
        })
        .unwrap_or(id)
}

fn errno_text(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::EPERM) => "refused (EPERM)".into(),
        Some(libc::EACCES) => "not open to this user (EACCES)".into(),
        Some(libc::ENOENT) => "absent (ENOENT)".into(),
        Some(libc::ENOSYS) => "not in this kernel (ENOSYS)".into(),
        _ => format!("refused ({e})"),
    }
}

/// The userfaultfd rows: how the engine can get a descriptor, and the
/// features it asks of it.
fn uffd_checks(inject: &Inject, user: &str) -> Vec<Check> {
    let probe = protect::probe(&inject.uffd_refusals());
    let usable = !inject.fail_uffd && probe.engine_can_open();
    let lost: &[&str] = if usable { &[] } else { &PROTECTED };
    let mut rows = vec![
        syscall_row(&probe, inject, lost),
        device_row(&probe, lost, user),
    ];
    rows.push(check(
        "userfaultfd, user-mode faults only",
        probe.user_mode_only.is_ok(),
        match &probe.user_mode_only {
            Ok(()) => "available to every user, not used: a kernel access (read(2)) into a \
                       protected page would fail with EFAULT instead of waiting"
                .into(),
            Err(e) => errno_text(e),
        },
    ));
    rows.extend(feature_rows(&probe, usable));
    rows
}

fn syscall_row(probe: &Probe, inject: &Inject, lost: &[&'static str]) -> Check {
    let name = "userfaultfd system call";
    let filtered = probe.syscall.is_err() && probe.user_mode_only.is_err();
    let state = match (&probe.syscall, inject.fail_uffd) {
        (_, true) => "refused (PAGEFOLD_INJECT_FAIL_UFFD)".to_string(),
        (Ok(()), false) => "works".to_string(),
        (Err(e), false) if filtered => format!(
            "{} for every kind of userfaultfd, as a sandbox's filter (seccomp) refuses it; \
             /dev/userfaultfd is not used, as it would go around the filter",
            errno_text(e)
        ),
        (Err(e), false) => {
            let mut s = errno_text(e);
            if e.raw_os_error() == Some(libc::EPERM) {
                s += &format!(
                    ": vm.unprivileged_userfaultfd = {} and no CAP_SYS_PTRACE",
                    sysctl("vm/unprivileged_userfaultfd").unwrap_or_else(|| "?".into())
                );
            }
            if probe.device.is_ok() {
                s += "; /dev/userfaultfd serves instead";
            }
            s
        }
    };
    let row = check(name, probe.syscall.is_ok() && !inject.fail_uffd, state);
    if lost.is_empty() {
        return row;
    }
    let fix = if filtered {
        "allow the userfaultfd system call in the sandbox's seccomp filter"
    } else {
        "sudo sysctl -w vm.unprivileged_userfaultfd=1   (every user; lasting: a line in /etc/sysctl.d/)"
    };
    row.missing(lost, fix)
}

fn device_row(probe: &Probe, lost: &[&'static str], user: &str) -> Check {
    let name = "/dev/userfaultfd";
    let found = device_mode();
    let state = match &probe.device {
        Ok(()) => format!("works ({found})"),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
            "absent (Linux 6.1 and later have it)".into()
        }
        Err(e) => format!("{} ({found})", errno_text(e)),
    };
    let row = check(name, probe.device.is_ok(), state);
    if lost.is_empty() || probe.device.is_ok() || probe.user_mode_only.is_err() {
        return row;
    }
    row.missing(
        lost,
        &format!(
            "sudo setfacl -m u:{user}:rw /dev/userfaultfd   (this user, until reboot; \
             docs/MECHANISMS.md has the lasting udev rule for a group)"
        ),
    )
}

/// `/dev/userfaultfd`'s mode and owners, as `ls -l` would put them.
fn device_mode() -> String {
    use std::os::unix::fs::MetadataExt;
    match std::fs::metadata("/dev/userfaultfd") {
        Ok(m) => format!(
            "mode {:o}, owner {}, group {}",
            m.mode() & 0o777,
            id_name("/etc/passwd", m.uid()),
            id_name("/etc/group", m.gid())
        ),
        Err(e) => e.to_string(),
    }
}

/// A feature's row: its name, whether it is offered, the first Linux with
/// it, and what its absence takes away.
type Feature = (&'static str, bool, &'static str, &'static [&'static str]);

/// The rows of the features the engine asks userfaultfd for.
fn feature_rows(probe: &Probe, usable: bool) -> Vec<Check> {
    let Some(f) = probe.features else {
        return vec![check(
            "userfaultfd features",
            false,
            "unknown: no userfaultfd could be opened".into(),
        )];
    };
    // Losses are named where userfaultfd is usable: otherwise its own rows name them.
    let lose = |have: bool, lost: &[&'static str]| -> Vec<&'static str> {
        if have || !usable {
            Vec::new()
        } else {
            lost.to_vec()
        }
    };
    let rows: [Feature; 5] = [
        (
            "userfaultfd WP (anonymous and shmem)",
            f.wp,
            "6.1",
            &PROTECTED,
        ),
        (
            "userfaultfd WP_UNPOPULATED",
            f.wp_unpopulated,
            "6.4",
            &PROTECTED,
        ),
        (
            "userfaultfd MISSING (shmem)",
            f.missing,
            "4.11",
            &[EVICT, POISON],
        ),
        ("userfaultfd POISON", f.poison, "6.6", &[POISON]),
        ("userfaultfd MOVE", f.move_pages, "6.8", &[PIN_GUARD]),
    ];
    rows.into_iter()
        .map(|(name, have, since, lost)| {
            let state = if have {
                "offered".to_string()
            } else {
                format!("not offered (Linux {since} and later have it)")
            };
            let row = check(name, have, state);
            let lost = lose(have, lost);
            if lost.is_empty() {
                row
            } else {
                row.missing(&lost, &format!("a kernel of Linux {since} or later"))
            }
        })
        .collect()
}

fn memfd_check(inject: &Inject) -> Check {
    let name = "memfd";
    let r = if inject.fail_memfd {
        Err(std::io::Error::from_raw_os_error(libc::EMFILE))
    } else {
        // SAFETY: the name is a NUL-terminated C string; the descriptor is closed below.
        let fd = unsafe { libc::memfd_create(c"pagefold-doctor".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            // SAFETY: fd was opened above and is used by nothing else.
            unsafe { libc::close(fd) };
            Ok(())
        }
    };
    match r {
        Ok(()) => check(name, true, "works".into()),
        Err(e) => check(name, false, format!("memfd_create: {e}")).missing(
            &[COPIES, ZERO, MERGE, COLOUR],
            "allow memfd_create (Linux 3.17 and later; a seccomp filter may forbid it)",
        ),
    }
}

/// Whether /proc/self/pagemap shows this process the PFN of a page it wrote.
fn pfn_check(inject: &Inject) -> Check {
    let name = "pagemap PFNs";
    let page = Box::new([1u8; 4096]);
    let entry = pagemap_entry(page.as_ptr() as usize);
    let pfn = entry.map(|e| e & ((1 << 55) - 1)).unwrap_or(0);
    if pfn != 0 && !inject.hide_pfns {
        return check(name, true, "visible".into());
    }
    check(
        name,
        false,
        "hidden (zero without CAP_SYS_ADMIN): footprints are PSS estimates (`pssproxy`)".into(),
    )
    .missing(
        &[FOOTPRINT, COLOUR],
        "run `pagefold measure` / `pagefold run` as root for exact footprints",
    )
}

fn pagemap_entry(addr: usize) -> Option<u64> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open("/proc/self/pagemap").ok()?;
    let mut b = [0u8; 8];
    f.read_exact_at(&mut b, (addr / 4096 * 8) as u64).ok()?;
    Some(u64::from_le_bytes(b))
}

/// A file under /proc/sys (`vm/max_map_count`), trimmed.
fn sysctl(name: &str) -> Option<String> {
    std::fs::read_to_string(format!("/proc/sys/{name}"))
        .ok()
        .map(|s| s.trim().to_string())
}

fn thp_check() -> Check {
    let read = |f: &str| {
        std::fs::read_to_string(format!("/sys/kernel/mm/transparent_hugepage/{f}"))
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "absent".into())
    };
    check(
        "transparent huge pages",
        true,
        format!(
            "anonymous {}; shmem {} (the engine maps frames page by page either way)",
            read("enabled"),
            read("shmem_enabled")
        ),
    )
}

fn ksm_check(cfg: &Config) -> Check {
    let name = "kernel KSM";
    let run = std::fs::read_to_string("/sys/kernel/mm/ksm/run").map(|s| s.trim().to_string());
    let running = run.as_deref().is_ok_and(|v| v == "1") && !cfg.inject.ksm_off;
    let opted = if cfg.ksm_handoff {
        "delegation on (PAGEFOLD_KSM=1)"
    } else {
        "delegation off (opt in: PAGEFOLD_KSM=1 or `pagefold run --ksm`)"
    };
    let state = match (&run, running) {
        (Err(_), _) => format!("absent (no CONFIG_KSM); {opted}"),
        (Ok(_), true) => format!("ksmd runs; {opted}"),
        (Ok(v), false) => format!("ksmd stopped (run = {v}); {opted}"),
    };
    let row = check(name, running, state);
    if running || run.is_err() {
        return row;
    }
    row.missing(&[KSM], "echo 1 | sudo tee /sys/kernel/mm/ksm/run")
}

/// The memory limit of this process's cgroup (v1 or v2), if any, which
/// pressure-driven tiering works against (pagefold_engine::memlimit).
fn cgroup_check(cfg: &Config) -> Check {
    use pagefold_engine::memlimit;
    let sources = memlimit::Sources::default();
    let group = (!cfg.inject.hide_cgroup)
        .then(|| memlimit::live_group(&sources))
        .flatten();
    let mut state = memlimit::describe(group.as_ref());
    if let Some(b) = cfg.memory_limit {
        state += &format!("; PAGEFOLD_MEMORY {:.0} MiB", b as f64 / (1 << 20) as f64);
    }
    check("memory limit", true, state)
}

fn max_map_check(cfg: &Config) -> Check {
    let count = cfg
        .inject
        .max_map_count
        .or_else(|| sysctl("vm/max_map_count").and_then(|s| s.parse().ok()));
    let Some(count) = count else {
        return check("vm.max_map_count", false, "not readable".into());
    };
    let budget = cfg.vma_budget_for(count);
    check(
        "vm.max_map_count",
        true,
        format!(
            "{count}: the engine's blocks may use {budget} mappings (merges of scattered \
             duplicates stop there; `sudo sysctl -w vm.max_map_count=262144` raises it)"
        ),
    )
}

/// The report as a table: one line a check, the missing ones followed by
/// what they take away and the fix, then what works.
pub fn table(r: &Report) -> String {
    let mut out = format!(
        "pagefold doctor: Linux {}, user {} (uid {})\n",
        r.kernel, r.user, r.uid
    );
    for c in &r.checks {
        let mark = if c.ok {
            "ok"
        } else if c.lost.is_empty() {
            "--"
        } else {
            "MISSING"
        };
        out += &format!("{mark:<8}{:<38}{}\n", c.name, c.state);
        if !c.lost.is_empty() {
            out += &format!("{:<8}{:<38}loses: {}\n", "", "", c.lost.join(", "));
        }
        if let Some(fix) = c.fix.as_ref().filter(|_| !c.lost.is_empty()) {
            out += &format!("{:<8}{:<38}fix: {fix}\n", "", "");
        }
    }
    let names = |works: bool| {
        r.mechanisms
            .iter()
            .filter(|m| m.works == works)
            .map(|m| m.name)
            .collect::<Vec<_>>()
            .join(", ")
    };
    out += &format!("works here: {}\n", names(true));
    let lost = names(false);
    out += &format!(
        "lost here: {}",
        if lost.is_empty() { "nothing" } else { &lost }
    );
    out
}
