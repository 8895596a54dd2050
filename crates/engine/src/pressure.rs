//! Pressure-driven tiering: when tiering runs by default (`Tier::Pressure`),
//! the clock makes passes only while memory is short, and sheds as much as
//! the shortage asks for (the way Meta's TMO drives proactive reclaim from
//! PSI).
//!
//! A *reading* is the binding limit and its usage (memlimit.rs: the memory
//! cgroup's limit against its working set, else `PAGEFOLD_MEMORY` against
//! the process's resident memory, else the machine's memory against what is
//! not available) and PSI's `some avg10` (the group's memory.pressure, else
//! the machine's /proc/pressure/memory). Memory is short from the moment the
//! usage passes `pressure_high` percent of the limit, or the group's *own*
//! PSI passes `pressure_psi`, until the usage is back under `pressure_low`
//! percent and the PSI under its threshold. The machine's PSI alone never
//! starts an episode: another group's stalls against its own limit say
//! nothing about this process's memory. While memory is short each pass
//! sheds the usage above the low mark plus, if PSI (either) is above its
//! threshold, `min(avg10, 20)` percent of the engine's footprint, so
//! passes shed faster the more the program stalls.
//!
//! The gauge reads on the background scanner's thread, while the program
//! runs, so it never opens a file there (fds.rs): every file a reading
//! reads (the group's limit, usage, memory.stat and memory.pressure files,
//! /proc/self/statm with a user's limit, /proc/meminfo, the machine's PSI
//! file) is opened once when the gauge is made at engine start, adopted
//! into the engine's descriptor range, and read with pread from offset 0,
//! which makes the kernel write the file afresh. A file that cannot be
//! opened then reads as unreadable for the engine's life (the fallbacks
//! below take over). In a child after fork /proc/self/statm is opened
//! again (the parent's names the parent); the group is the parent's too.
//!
//! Reading costs a few small files (at most 0.5 ms a look on a cgroup v1
//! machine, where a read of a large memory.stat takes about 0.1 ms), about
//! 0.1% of a core at two looks a second; the background scanner
//! reads once a clock interval (pressure polls) and otherwise keeps its
//! schedule, so a program with room to spare gets no clock pass, no page
//! classified and no tiering metadata.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use serde::Serialize;

use crate::config::Config;
use crate::memlimit::{self, Binding, Group, Sources};
use crate::sys::KeptFile;

/// PSI's share counted as shed per pass at most (percent of the footprint).
pub const PSI_SHED_MAX_PERCENT: f64 = 20.0;

/// Limit files (`Group::limit_files`, the group's own first) the gauge keeps
/// open; those of ancestors further up are read once, when it is made.
pub const MAX_LIMIT_FILES: usize = 16;
/// Descriptors a gauge holds at most: the limit files, the usage and
/// memory.stat, a PSI file, /proc/self/statm and /proc/meminfo.
pub const MAX_FILES: usize = MAX_LIMIT_FILES + 5;

/// A file a reading reads.
enum Kept {
    /// Opened when the gauge was made, read afresh at every reading.
    Open(KeptFile),
    /// Read once when the gauge was made (an ancestor's limit beyond `MAX_LIMIT_FILES`).
    Fixed(Option<String>),
}

/// What the gauge reads from: resolved, and every file it reads opened, when
/// it is made (at engine start), so that a reading on the background
/// scanner's thread never opens a file (fds.rs).
pub struct Gauge {
    sources: Sources,
    group: Option<Group>,
    user_limit: Option<u64>,
    /// Swap free as the fault injection pretends it.
    swap_free: Option<u64>,
    /// The group's own PSI file (true), or the machine's.
    psi: Option<(PathBuf, bool)>,
    /// The files readings read; a file that could not be opened when the
    /// gauge was made is not here, and reads as unreadable.
    files: Vec<(PathBuf, Kept)>,
    /// Files refused a descriptor (`open_files`).
    refused: u64,
    /// Whether the kept /proc/self/statm describes this process: false in a
    /// child after fork where it could not be opened afresh.
    statm_live: AtomicBool,
}

/// One look at memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Reading {
    /// The limit that binds and the usage against it (bytes); None: none found.
    pub limit: u64,
    pub used: u64,
    pub source: Option<memlimit::Source>,
    /// PSI some avg10 (percent), and whether it is the group's own.
    pub psi: Option<f64>,
    pub psi_own: bool,
    /// The machine's free swap (bytes; /proc/meminfo), None if unreadable.
    pub swap_free: Option<u64>,
}

impl Gauge {
    /// The live gauge, under `cfg`'s limit and fault injection.
    pub fn new(cfg: &Config) -> Gauge {
        Gauge::from_sources(Sources::default(), cfg)
    }

    /// Finds the group (reading /proc/self/cgroup and mountinfo once) and
    /// opens every file readings will read.
    pub fn from_sources(sources: Sources, cfg: &Config) -> Gauge {
        let group = (!cfg.inject.hide_cgroup)
            .then(|| memlimit::live_group(&sources))
            .flatten();
        let own = group.as_ref().and_then(Group::psi_file).map(|f| (f, true));
        let system = Some(sources.system_psi.clone())
            .filter(|f| f.is_file())
            .map(|f| (f, false));
        let psi = (!cfg.inject.hide_psi).then(|| own.or(system)).flatten();
        let (files, refused) = Gauge::open_files(&sources, group.as_ref(), cfg.memory_limit, &psi);
        Gauge {
            sources,
            group,
            user_limit: cfg.memory_limit,
            swap_free: cfg.inject.swap_free,
            psi,
            files,
            refused,
            statm_live: AtomicBool::new(true),
        }
    }

    /// The files readings read, opened; and how many were refused a
    /// descriptor. A gauge missing some of its files would misread memory,
    /// so one refusal gives every file back: the gauge then reads nothing
    /// and memory never counts as short.
    fn open_files(
        sources: &Sources,
        group: Option<&Group>,
        user_limit: Option<u64>,
        psi: &Option<(PathBuf, bool)>,
    ) -> (Vec<(PathBuf, Kept)>, u64) {
        let mut paths = Vec::new();
        let mut fixed = Vec::new();
        if let Some(g) = group {
            let mut limits = g.limit_files();
            fixed = limits.split_off(limits.len().min(MAX_LIMIT_FILES));
            paths.extend(limits);
            paths.extend(g.usage_files());
        }
        paths.extend(psi.as_ref().map(|(f, _)| f.clone()));
        paths.extend(user_limit.map(|_| sources.statm.clone()));
        paths.push(sources.meminfo.clone());
        let mut seen = std::collections::HashSet::new();
        paths.retain(|p| seen.insert(p.clone()));
        let mut refused = 0;
        let mut files = Vec::new();
        for p in paths {
            match KeptFile::open_spare(&p) {
                Ok(f) => files.push((p, Kept::Open(f))),
                Err(e) if e.raw_os_error() == Some(libc::EMFILE) => refused += 1,
                Err(_) => {}
            }
        }
        if refused > 0 {
            return (Vec::new(), refused);
        }
        debug_assert!(files.len() <= MAX_FILES);
        files.extend(fixed.into_iter().map(|p| {
            let text = memlimit::read_path(&p);
            (p, Kept::Fixed(text))
        }));
        (files, 0)
    }

    /// Files refused a descriptor when the gauge was made (every file is
    /// then given back, and memory reads as never short).
    pub fn refused(&self) -> u64 {
        self.refused
    }

    /// A file's text now, through its kept descriptor; None for a file not
    /// opened when the gauge was made.
    fn text(&self, path: &Path) -> Option<String> {
        if path == self.sources.statm && !self.statm_live.load(Ordering::Acquire) {
            return None;
        }
        match &self.files.iter().find(|(p, _)| p == path)?.1 {
            Kept::Open(f) => f.text(),
            Kept::Fixed(text) => text.clone(),
        }
    }

    /// In a child right after fork: /proc/self/statm, opened by the parent,
    /// describes the parent; it is opened afresh. (The group's files, which
    /// the child shares, and the machine's stay as they are.)
    pub fn after_fork_in_child(&self) {
        let statm = self.files.iter().find(|(p, _)| *p == self.sources.statm);
        if let Some((path, Kept::Open(f))) = statm {
            let live = f.reopen_in_child(path).is_ok();
            self.statm_live.store(live, Ordering::Release);
        }
    }

    /// The kept file read for `path` (for tests).
    #[cfg(test)]
    fn text_file(&self, path: &Path) -> Option<&KeptFile> {
        match &self.files.iter().find(|(p, _)| p == path)?.1 {
            Kept::Open(f) => Some(f),
            Kept::Fixed(_) => None,
        }
    }

    /// How many descriptors the gauge holds.
    #[cfg(test)]
    fn descriptors(&self) -> usize {
        self.files
            .iter()
            .filter(|(_, k)| matches!(k, Kept::Open(_)))
            .count()
    }

    pub fn read(&self) -> Reading {
        // Read once: the machine's binding and its free swap both come from it.
        let meminfo = self.text(&self.sources.meminfo);
        let read = |p: &Path| match p == self.sources.meminfo {
            true => meminfo.clone(),
            false => self.text(p),
        };
        let binding = memlimit::binding(&self.sources, self.group.as_ref(), self.user_limit, &read);
        let psi = self.psi.as_ref().and_then(|(f, own)| {
            let v = memlimit::parse_psi(&self.text(f)?)?;
            Some((v, *own))
        });
        let Binding {
            source,
            limit,
            used,
        } = binding.unwrap_or(Binding {
            source: memlimit::Source::Machine,
            limit: 0,
            used: 0,
        });
        let swap_free = self
            .swap_free
            .or_else(|| memlimit::parse_swap_free(meminfo.as_deref()?));
        Reading {
            limit,
            used,
            source: binding.map(|_| source),
            psi: psi.map(|p| p.0),
            psi_own: psi.is_some_and(|p| p.1),
            swap_free,
        }
    }
}

impl Reading {
    fn mark(&self, percent: u32) -> u64 {
        (self.limit as u128 * percent as u128 / 100) as u64
    }

    fn psi_above(&self, cfg: &Config) -> bool {
        self.psi.is_some_and(|p| p > cfg.pressure_psi)
    }

    /// Whether the kernel can swap (the machine has swap free): then its own
    /// reclaim, which sees reads, relieves the shortage too, and passes must
    /// show they pay (governor.rs). Unreadable counts as no swap.
    pub fn kernel_swaps(&self) -> bool {
        self.swap_free.is_some_and(|b| b > 0)
    }

    /// Whether memory is short, given whether it was at the last pass.
    pub fn short(&self, was_short: bool, cfg: &Config) -> bool {
        if self.limit == 0 {
            return false;
        }
        let own_psi = self.psi_own && self.psi_above(cfg);
        if self.used > self.mark(cfg.pressure_high) || own_psi {
            return true;
        }
        was_short && (self.used > self.mark(cfg.pressure_low) || self.psi_above(cfg))
    }

    /// Bytes a pass should shed while memory is short, with the engine's
    /// footprint (see the module comment).
    pub fn shed(&self, footprint: u64, cfg: &Config) -> u64 {
        let over = self.used.saturating_sub(self.mark(cfg.pressure_low));
        let stall = match self.psi.filter(|_| self.psi_above(cfg)) {
            Some(p) => (footprint as f64 * p.min(PSI_SHED_MAX_PERCENT) / 100.0) as u64,
            None => 0,
        };
        (over + stall).max(crate::sys::PAGE as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(used_mb: u64, psi: Option<f64>, own: bool) -> Reading {
        Reading {
            limit: 1000 << 20,
            used: used_mb << 20,
            source: Some(memlimit::Source::Cgroup),
            psi,
            psi_own: own,
            swap_free: None,
        }
    }

    /// A cgroup v2 hierarchy in a temporary directory, and the /proc files
    /// that place this process in its group `job` (limit 100 MiB, 50 MiB in
    /// use); `with_usage` false leaves memory.current out.
    fn fake_v2(name: &str, with_usage: bool) -> (PathBuf, Sources) {
        let root =
            std::env::temp_dir().join(format!("pagefold-gauge-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let job = root.join("job");
        std::fs::create_dir_all(&job).unwrap();
        let write = |f: &str, t: &str| std::fs::write(root.join(f), t).unwrap();
        write("cgroup", "0::/job\n");
        let mount = format!("29 23 0:26 / {} rw - cgroup2 cgroup2 rw\n", root.display());
        write("mountinfo", &mount);
        write("job/memory.max", &format!("{}\n", 100 << 20));
        write("job/memory.stat", "anon 1\ninactive_file 0\n");
        if with_usage {
            write("job/memory.current", &format!("{}\n", 50 << 20));
        }
        let sources = Sources {
            proc_cgroup: root.join("cgroup"),
            mountinfo: root.join("mountinfo"),
            ..Sources::default()
        };
        (root, sources)
    }

    #[test]
    fn a_gauge_reads_through_the_descriptors_it_opened_when_made() {
        let (root, sources) = fake_v2("kept", true);
        let g = Gauge::from_sources(sources, &Config::default());
        let r = g.read();
        assert_eq!(r.source, Some(memlimit::Source::Cgroup), "{r:?}");
        assert_eq!((r.limit, r.used), (100 << 20, 50 << 20));
        // Rewritten in place: the kept descriptor reads the new value.
        let current = root.join("job/memory.current");
        std::fs::write(&current, format!("{}\n", 90 << 20)).unwrap();
        assert_eq!(g.read().used, 90 << 20);
        // Replaced by a new file at the path: the gauge opens nothing, so it
        // still reads the file it opened.
        std::fs::remove_file(&current).unwrap();
        std::fs::write(&current, format!("{}\n", 10 << 20)).unwrap();
        assert_eq!(g.read().used, 90 << 20);
        assert!(g.descriptors() <= MAX_FILES);
        // Every descriptor sits in the engine's range.
        for (_, k) in &g.files {
            if let Kept::Open(f) = k {
                assert!(crate::fds::is_engine(f.number()));
            }
        }
        drop(g);
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_file_that_cannot_be_opened_when_the_gauge_is_made_falls_back() {
        // No memory.current at start: the cgroup gives no binding, and the
        // machine's memory binds, even once the file appears.
        let (root, sources) = fake_v2("missing", false);
        let g = Gauge::from_sources(sources.clone(), &Config::default());
        assert_eq!(g.read().source, Some(memlimit::Source::Machine));
        std::fs::write(root.join("job/memory.current"), "1\n").unwrap();
        assert_eq!(g.read().source, Some(memlimit::Source::Machine));
        // No statm at start: the user's limit has no usage, the machine binds.
        let cfg = user_limit_alone();
        let no_statm = Sources {
            statm: root.join("no-statm"),
            ..sources
        };
        let g = Gauge::from_sources(no_statm, &cfg);
        assert_eq!(g.read().source, Some(memlimit::Source::Machine));
        let g = Gauge::from_sources(Sources::default(), &cfg);
        assert_eq!(g.read().source, Some(memlimit::Source::User));
        std::fs::remove_dir_all(&root).unwrap();
    }

    /// A user's limit of 1 GiB with no cgroup readable.
    fn user_limit_alone() -> Config {
        Config {
            memory_limit: Some(1 << 30),
            inject: crate::config::Inject {
                hide_cgroup: true,
                ..Default::default()
            },
            ..Config::default()
        }
    }

    /// (st_dev, st_ino) of a descriptor.
    fn identity(n: i32) -> (u64, u64) {
        // SAFETY: an all-zero stat is a valid value of the plain C struct.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: st is a live local for fstat to fill; a bad number is an error.
        assert_eq!(unsafe { libc::fstat(n, &mut st) }, 0);
        (st.st_dev, st.st_ino)
    }

    #[test]
    fn in_a_child_after_fork_statm_is_opened_afresh() {
        let cfg = user_limit_alone();
        let g = Gauge::from_sources(Sources::default(), &cfg);
        let statm = |g: &Gauge| match &g.text_file(&g.sources.statm) {
            Some(f) => identity(f.number()),
            None => (0, 0),
        };
        let own = || {
            use std::os::unix::fs::MetadataExt;
            let m = std::fs::metadata("/proc/self/statm").unwrap();
            (m.dev(), m.ino())
        };
        assert_eq!(statm(&g), own());
        // SAFETY: the child only reads files, allocates (glibc's allocator
        // is reset in a child) and leaves with _exit.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            crate::fds::after_fork_child();
            let inherited = statm(&g) != own();
            g.after_fork_in_child();
            let fresh = statm(&g) == own();
            let read = g.read().source == Some(memlimit::Source::User);
            // SAFETY: ends the child without running the parent's handlers.
            unsafe { libc::_exit(if inherited && fresh && read { 0 } else { 1 }) };
        }
        let mut status = 0;
        // SAFETY: status is a live local; pid is the child just forked.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "{status}"
        );
        assert_eq!(statm(&g), own(), "the parent's stays");
    }

    #[test]
    fn short_from_the_high_mark_until_below_the_low_one() {
        let cfg = Config::default();
        assert!(!at(800, None, false).short(false, &cfg));
        assert!(at(810, None, false).short(false, &cfg));
        assert!(at(720, None, false).short(true, &cfg), "hysteresis");
        assert!(!at(690, None, false).short(true, &cfg));
        assert!(!at(720, None, false).short(false, &cfg));
        let none = Reading::default();
        assert!(!none.short(true, &cfg), "no limit known, nothing read");
    }

    #[test]
    fn only_the_groups_own_psi_starts_an_episode() {
        let cfg = Config::default();
        assert!(at(100, Some(5.0), true).short(false, &cfg));
        assert!(!at(100, Some(5.0), false).short(false, &cfg));
        assert!(at(100, Some(5.0), false).short(true, &cfg), "but keeps one");
        assert!(!at(100, Some(0.5), true).short(false, &cfg), "below 1%");
    }

    #[test]
    fn shed_follows_usage_and_stalls() {
        let cfg = Config::default();
        assert_eq!(at(900, None, false).shed(0, &cfg), 200 << 20);
        assert_eq!(
            at(900, Some(10.0), true).shed(500 << 20, &cfg),
            (200 << 20) + (50 << 20)
        );
        assert_eq!(
            at(100, Some(90.0), true).shed(500 << 20, &cfg),
            100 << 20,
            "at most 20% of the footprint for stalls"
        );
        assert_eq!(at(100, None, false).shed(0, &cfg), 4096, "at least a page");
    }
}
