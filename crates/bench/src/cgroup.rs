//! A memory cgroup (v1) for one run of a program under a memory limit. The
//! memory-constrained runs put each run in a fresh group, so its peak usage,
//! swap and major faults are its own and no page cache charged by an earlier
//! run counts against its limit.
//!
//! The group is created as `MEMORY_ROOT/pagefold-bench-PID-N`, the child
//! joins it before exec (`join_from_child`, from `pre_exec`), and the group
//! is removed when the guard goes: every process still in it is killed first
//! (a workload that forked and left something behind, a run cut short by its
//! time limit). Removal is registered with `teardown`, so a panic or a
//! SIGINT/SIGTERM removes it too; a group left by a SIGKILLed harness is
//! recognised by the dead pid in its name and swept by `sweep_leftovers`.
//!
//! Swap is left unlimited (memory.memsw.limit_in_bytes untouched), so what
//! does not fit under the limit is swapped rather than OOM-killed as long as
//! swap has room.

use std::ffi::{CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use serde::Serialize;

use crate::sys::{self, c_path, errno, sleep_ms, Fd};
use crate::teardown::{self, Failure, Registration, Teardown};

/// Where the cgroup v1 memory controller is mounted.
pub const MEMORY_ROOT: &str = "/sys/fs/cgroup/memory";
/// Every group this harness creates is named PREFIX + "PID-N".
pub const PREFIX: &str = "pagefold-bench-";
/// How long removal waits for killed processes to leave the group.
const EXIT_WAIT_MS: u64 = 30_000;

/// A cgroup of ours; removed (its processes killed) on drop.
pub struct MemoryCgroup {
    dir: PathBuf,
    procs: CString,
    limit: Option<u64>,
    removal: Registration,
}

/// What a group used, read just before it is removed.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Usage {
    /// memory.max_usage_in_bytes: the most memory (anonymous, shmem, page
    /// cache, kernel) charged to the group at any time.
    pub max_usage_bytes: u64,
    /// Major faults of the group's processes (memory.stat pgmajfault).
    pub major_faults: u64,
    /// Processes the OOM killer killed in the group (memory.oom_control oom_kill).
    pub oom_kills: u64,
    /// Times the limit was hit (memory.failcnt).
    pub limit_hits: u64,
}

/// Fails with the reason if memory cgroups cannot be made here.
pub fn check_available() -> Result<(), String> {
    if !sys::is_root() {
        return Err("memory-constrained runs need root (cgroups and swap devices)".into());
    }
    if !Path::new(MEMORY_ROOT)
        .join("memory.limit_in_bytes")
        .is_file()
    {
        return Err(format!(
            "no cgroup v1 memory controller at {MEMORY_ROOT} (cgroup v2 is not supported)"
        ));
    }
    Ok(())
}

/// Whether memory.stat reports swap per group (swap accounting, the memsw files).
pub fn swap_accounted() -> bool {
    Path::new(MEMORY_ROOT)
        .join("memory.memsw.usage_in_bytes")
        .is_file()
}

impl MemoryCgroup {
    /// A fresh group limited to `limit` bytes (None: no limit).
    pub fn create(limit: Option<u64>) -> Result<MemoryCgroup, String> {
        static CREATED: AtomicU32 = AtomicU32::new(0);
        let n = CREATED.fetch_add(1, Ordering::Relaxed);
        let dir = Path::new(MEMORY_ROOT).join(format!("{PREFIX}{}-{n}", std::process::id()));
        std::fs::create_dir(&dir).map_err(|e| format!("creating cgroup {}: {e}", dir.display()))?;
        let removal = teardown::register(Box::new(Removal::of(&dir)))?;
        let procs = c_path(&dir.join("cgroup.procs"));
        let group = MemoryCgroup {
            dir,
            procs,
            limit,
            removal,
        };
        if let Some(bytes) = limit {
            group.write("memory.limit_in_bytes", &bytes.to_string())?;
        }
        Ok(group)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn limit(&self) -> Option<u64> {
        self.limit
    }

    /// cgroup.procs, for `join_from_child`.
    pub fn procs_file(&self) -> &CStr {
        &self.procs
    }

    /// The pids in the group now.
    pub fn members(&self) -> Vec<u32> {
        let text = std::fs::read_to_string(self.dir.join("cgroup.procs")).unwrap_or_default();
        text.split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect()
    }

    /// SIGKILLs every process in the group now (without waiting for them).
    pub fn kill_members(&self) {
        kill_members(&self.procs);
    }

    /// Swap in use by the group now (memory.stat `swap`), if accounted.
    pub fn swap_bytes(&self) -> Option<u64> {
        self.stat("swap")
    }

    /// A counter of memory.stat.
    pub fn stat(&self, key: &str) -> Option<u64> {
        let text = std::fs::read_to_string(self.dir.join("memory.stat")).ok()?;
        text.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.trim().parse().ok())
    }

    pub fn usage(&self) -> Usage {
        let read = |f: &str| std::fs::read_to_string(self.dir.join(f)).unwrap_or_default();
        let number = |f: &str| read(f).trim().parse().unwrap_or(0);
        let oom_kills = read("memory.oom_control")
            .lines()
            .find_map(|l| l.strip_prefix("oom_kill ")?.trim().parse().ok())
            .unwrap_or(0);
        Usage {
            max_usage_bytes: number("memory.max_usage_in_bytes"),
            major_faults: self.stat("pgmajfault").unwrap_or(0),
            oom_kills,
            limit_hits: number("memory.failcnt"),
        }
    }

    /// Kills what is left in the group and removes it; the error says what stayed.
    pub fn remove(self) -> Result<(), String> {
        let dir = self.dir.display().to_string();
        self.removal
            .finish()
            .map_err(|f| format!("removing cgroup {dir}: {f}"))
    }

    fn write(&self, file: &str, value: &str) -> Result<(), String> {
        let path = self.dir.join(file);
        std::fs::write(&path, value)
            .map_err(|e| format!("writing {value} to {}: {e}", path.display()))
    }
}

/// Moves the calling process into the group. For `pre_exec`: only open,
/// write and close ("0" names the writer, so no pid is formatted).
pub fn join_from_child(procs: &CStr) -> std::io::Result<()> {
    let Some(fd) = Fd::open(procs, libc::O_WRONLY | libc::O_CLOEXEC) else {
        return Err(std::io::Error::last_os_error());
    };
    let written = fd.write(b"0");
    let e = std::io::Error::last_os_error();
    drop(fd);
    if written != 1 {
        return Err(e);
    }
    Ok(())
}

/// Makes the program `cmd` starts join the group whose cgroup.procs is
/// `procs` (see `MemoryCgroup::procs_file`) before it execs.
pub fn join_before_exec(cmd: &mut std::process::Command, procs: CString) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the forked child of a possibly
    // multi-threaded process, and join_from_child only opens, writes and
    // closes a file (sys::Fd: async-signal-safe, no allocation, no lock);
    // `procs` was made before the fork and is moved into the closure.
    unsafe { cmd.pre_exec(move || join_from_child(&procs)) };
}

/// The teardown of a group: paths prepared in advance.
struct Removal {
    dir: CString,
    procs: CString,
}

impl Removal {
    fn of(dir: &Path) -> Removal {
        Removal {
            dir: c_path(dir),
            procs: c_path(&dir.join("cgroup.procs")),
        }
    }
}

impl Teardown for Removal {
    /// SIGKILLs the members until the group is empty, then removes it.
    fn teardown(&self) -> Result<(), Failure> {
        let mut waited = 0;
        loop {
            kill_members(&self.procs);
            // SAFETY: `dir` is a NUL-terminated path prepared with the guard
            // and alive for the call; rmdir only reads it.
            if unsafe { libc::rmdir(self.dir.as_ptr()) } == 0 {
                return Ok(());
            }
            match errno() {
                libc::ENOENT => return Ok(()),
                libc::EBUSY if waited < EXIT_WAIT_MS => {}
                e => {
                    return Err(Failure {
                        what: "removing the cgroup (killed processes still in it?)",
                        errno: e,
                    })
                }
            }
            sleep_ms(10);
            waited += 10;
        }
    }
}

/// SIGKILLs every pid listed in cgroup.procs. Allocation-free.
fn kill_members(procs: &CStr) {
    let mut buf = [0u8; 4096];
    let Some(fd) = Fd::open(procs, libc::O_RDONLY | libc::O_CLOEXEC) else {
        return;
    };
    let mut pid: i32 = 0;
    loop {
        let n = fd.read(&mut buf);
        if n <= 0 {
            break;
        }
        for &b in &buf[..n as usize] {
            if b.is_ascii_digit() {
                pid = pid * 10 + (b - b'0') as i32;
            } else {
                if pid > 0 {
                    sys::kill(pid, libc::SIGKILL);
                }
                pid = 0;
            }
        }
    }
    if pid > 0 {
        sys::kill(pid, libc::SIGKILL);
    }
}

/// Removes groups of ours whose harness is gone (it was SIGKILLed); returns
/// what was removed.
pub fn sweep_leftovers() -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(MEMORY_ROOT) else {
        return Vec::new();
    };
    let mut swept = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(owner) = name
            .strip_prefix(PREFIX)
            .and_then(|rest| rest.split('-').next()?.parse::<u32>().ok())
        else {
            continue;
        };
        if owner == std::process::id() || sys::pid_alive(owner) {
            continue;
        }
        match Removal::of(&entry.path()).teardown() {
            Ok(()) => swept.push(format!("cgroup {}", entry.path().display())),
            Err(f) => eprintln!(
                "bench: could not remove leftover cgroup {}: {f}",
                entry.path().display()
            ),
        }
    }
    swept
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn skip_unless_available() -> bool {
        if let Err(why) = check_available() {
            eprintln!("skipped: {why}");
            return true;
        }
        false
    }

    #[test]
    fn a_group_with_a_process_that_escaped_its_parent_is_removed() {
        if skip_unless_available() {
            return;
        }
        let group = MemoryCgroup::create(Some(64 << 20)).unwrap();
        let dir = group.dir().to_path_buf();
        assert_eq!(
            std::fs::read_to_string(dir.join("memory.limit_in_bytes"))
                .unwrap()
                .trim(),
            (64u64 << 20).to_string()
        );
        // A daemon-like grandchild: its parent exits, it lives on in the group.
        let procs = group.procs_file().to_owned();
        let mut cmd = std::process::Command::new("sh");
        cmd.args([
            "-c",
            "setsid sleep 60 </dev/null >/dev/null 2>&1 & echo started",
        ]);
        join_before_exec(&mut cmd, procs);
        let out = cmd.output().unwrap();
        assert_eq!(out.stdout, b"started\n");
        assert_eq!(group.members().len(), 1, "the sleep is still in the group");
        group.remove().unwrap();
        assert!(!dir.exists());
    }

    #[test]
    fn a_leftover_group_of_a_dead_harness_is_swept() {
        if skip_unless_available() {
            return;
        }
        let mut dead = std::process::Command::new("true").spawn().unwrap();
        let pid = dead.id();
        dead.wait().unwrap();
        let dir = Path::new(MEMORY_ROOT).join(format!("{PREFIX}{pid}-0"));
        std::fs::create_dir(&dir).unwrap();
        let swept = sweep_leftovers();
        assert!(
            swept
                .iter()
                .any(|s| s.contains(&format!("{PREFIX}{pid}-0"))),
            "{swept:?}"
        );
        assert!(!dir.exists());
    }
}
