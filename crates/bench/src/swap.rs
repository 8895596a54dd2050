//! Swap devices for the memory-constrained runs: a swap file on disk, or a
//! zram device (compressed swap in RAM). A `SwapDevice` writes the swap
//! header itself (the kernel reads one page: version, last page, label and
//! the SWAPSPACE2 magic) and calls swapon(2) at the highest priority, so it
//! is used before any swap already active on the machine. Dropping it calls
//! swapoff(2) and deletes the file or resets the zram device; that teardown
//! is registered with `teardown` (panic, SIGINT/SIGTERM) and is made of
//! system calls only.
//!
//! Devices are labelled `pagefold-PID` (files are also named after the pid):
//! one left active by a SIGKILLed harness is found and removed by
//! `sweep_leftovers`. Swap devices already active from elsewhere are never
//! touched. A `SwapLock` (an flock on LOCK_FILE) makes harnesses and tests
//! take turns, so only one of our devices is active at a time and each run
//! swaps where it is meant to.

use std::ffi::{CStr, CString};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::sys::{self, c_path, errno, sleep_ms, Fd};
use crate::teardown::{self, Failure, Registration, Teardown};

/// flock'ed while one of our swap devices may exist.
pub const LOCK_FILE: &str = "/run/lock/pagefold-swap.lock";
/// The highest swap priority: ours is filled before anything else.
const PRIORITY: libc::c_int = 32767;
const SWAP_FLAG_PREFER: libc::c_int = 0x8000;
/// Label of our devices: LABEL_PREFIX + pid (at most 16 bytes).
const LABEL_PREFIX: &str = "pagefold-";
/// Swap file names: FILE_PREFIX + "PID-N.swap".
const FILE_PREFIX: &str = "pagefold-swap-";
const TMPFS_MAGIC: i64 = 0x0102_1994;

/// Proof that this thread may create swap devices: one holder at a time, across processes.
pub struct SwapLock {
    _file: File,
}

impl SwapLock {
    /// Waits up to `wait` for the lock.
    pub fn acquire(wait: Duration) -> Result<SwapLock, String> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(LOCK_FILE)
            .map_err(|e| format!("{LOCK_FILE}: {e}"))?;
        let deadline = Instant::now() + wait;
        let mut said = false;
        while !sys::try_lock_exclusive(&file) {
            if Instant::now() > deadline {
                return Err(format!(
                    "another harness holds {LOCK_FILE} (a swap device of ours is in use)"
                ));
            }
            if !said {
                eprintln!(
                    "bench: another harness is using a swap device ({LOCK_FILE} held); waiting"
                );
                said = true;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(SwapLock { _file: file })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    File,
    Zram,
}

/// An active swap device of ours; swapped off and removed on drop.
pub struct SwapDevice {
    kind: Kind,
    /// The file, or /dev/zramN.
    path: PathBuf,
    /// /sys/block/zramN for zram.
    sysfs: Option<PathBuf>,
    size: u64,
    removal: Registration,
}

/// The zram device's own counters (mm_stat), in bytes.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct ZramStats {
    /// Uncompressed size of what is stored.
    pub stored_bytes: u64,
    /// Memory the compressed store takes now, and at most since the last reset.
    pub pool_bytes: u64,
    pub pool_peak_bytes: u64,
}

impl SwapDevice {
    /// A swap file of `size` bytes in `dir` (a disk filesystem: not tmpfs).
    pub fn file(_lock: &SwapLock, dir: &Path, size: u64) -> Result<SwapDevice, String> {
        check_swap_dir(dir)?;
        check_free_space(dir, size)?;
        let path = unused_file_name(dir);
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| format!("creating swap file {}: {e}", path.display()))?;
        let removal = teardown::register(Box::new(Removal {
            path: c_path(&path),
            file: true,
            reset: None,
        }))?;
        let dev = SwapDevice {
            kind: Kind::File,
            path,
            sysfs: None,
            size,
            removal,
        };
        // Allocated, not sparse: the kernel refuses swap files with holes.
        if !allocate(&file, size) {
            return Err(format!(
                "allocating {} MiB for {}: {}",
                size >> 20,
                dev.path.display(),
                std::io::Error::last_os_error()
            ));
        }
        write_header(&file, size, &dev.path)?;
        drop(file);
        dev.swap_on()?;
        Ok(dev)
    }

    /// A zram device of `size` bytes (uncompressed capacity) compressing with `algorithm`.
    pub fn zram(_lock: &SwapLock, size: u64, algorithm: &str) -> Result<SwapDevice, String> {
        let sysfs = claim_zram(size, algorithm)?;
        let name = sysfs
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        let path = Path::new("/dev").join(&name);
        let reset = Some(c_path(&sysfs.join("reset")));
        let removal = teardown::register(Box::new(Removal {
            path: c_path(&path),
            file: false,
            reset,
        }))?;
        let dev = SwapDevice {
            kind: Kind::Zram,
            path,
            sysfs: Some(sysfs),
            size,
            removal,
        };
        let device = std::fs::OpenOptions::new()
            .write(true)
            .open(&dev.path)
            .map_err(|e| format!("{}: {e}", dev.path.display()))?;
        write_header(&device, size, &dev.path)?;
        drop(device);
        dev.swap_on()?;
        Ok(dev)
    }

    pub fn kind(&self) -> Kind {
        self.kind
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    /// Bytes of this device in use now (/proc/swaps).
    pub fn used_bytes(&self) -> Option<u64> {
        active_swaps()
            .into_iter()
            .find(|s| s.path == self.path)
            .map(|s| s.used_bytes)
    }

    /// zram's counters (None for a file).
    pub fn zram_stats(&self) -> Option<ZramStats> {
        let text = std::fs::read_to_string(self.sysfs.as_ref()?.join("mm_stat")).ok()?;
        let f: Vec<u64> = text
            .split_whitespace()
            .filter_map(|v| v.parse().ok())
            .collect();
        Some(ZramStats {
            stored_bytes: *f.first()?,
            pool_bytes: *f.get(2)?,
            pool_peak_bytes: *f.get(4)?,
        })
    }

    /// Starts zram's peak pool size over (a file has none).
    pub fn reset_zram_peak(&self) {
        if let Some(sysfs) = &self.sysfs {
            let _ = std::fs::write(sysfs.join("mem_used_max"), "0");
        }
    }

    /// Swaps off and removes the device; the error says what is left.
    pub fn remove(self) -> Result<(), String> {
        let path = self.path.display().to_string();
        self.removal
            .finish()
            .map_err(|f| format!("removing swap device {path}: {f}"))
    }

    fn swap_on(&self) -> Result<(), String> {
        if swapon(&c_path(&self.path), SWAP_FLAG_PREFER | PRIORITY) != 0 {
            let e = std::io::Error::last_os_error();
            return Err(format!("swapon {}: {e}", self.path.display()));
        }
        Ok(())
    }
}

/// What undoes a device: swapoff, then delete the file or reset zram.
struct Removal {
    path: CString,
    file: bool,
    reset: Option<CString>,
}

impl Teardown for Removal {
    fn teardown(&self) -> Result<(), Failure> {
        // EINVAL: not (or no longer) active, e.g. swapon never succeeded.
        // SAFETY: `path` is a NUL-terminated path prepared with the device
        // and alive for the call; swapoff only reads it.
        if unsafe { libc::swapoff(self.path.as_ptr()) } != 0 && errno() != libc::EINVAL {
            return Err(Failure {
                what: "swapoff",
                errno: errno(),
            });
        }
        // SAFETY: as for swapoff: a NUL-terminated path, only read.
        if self.file && unsafe { libc::unlink(self.path.as_ptr()) } != 0 && errno() != libc::ENOENT
        {
            return Err(Failure {
                what: "deleting the swap file",
                errno: errno(),
            });
        }
        match &self.reset {
            Some(reset) => reset_zram(reset),
            None => Ok(()),
        }
    }
}

/// Writes "1" to zram's reset, retrying while the device is still being closed.
fn reset_zram(reset: &CString) -> Result<(), Failure> {
    for _ in 0..500 {
        let Some(fd) = Fd::open(reset, libc::O_WRONLY | libc::O_CLOEXEC) else {
            return Err(Failure {
                what: "opening zram reset",
                errno: errno(),
            });
        };
        let written = fd.write(b"1");
        let e = errno();
        drop(fd);
        if written == 1 {
            return Ok(());
        }
        if e != libc::EBUSY {
            return Err(Failure {
                what: "resetting zram",
                errno: e,
            });
        }
        sleep_ms(10);
    }
    Err(Failure {
        what: "resetting zram (still busy after 5 s)",
        errno: libc::EBUSY,
    })
}

/// The first page of a swap area (see the kernel's `union swap_header`).
pub fn header(size: u64, label: &str) -> Vec<u8> {
    let page = page_size();
    let mut h = vec![0u8; page];
    let last_page = (size / page as u64).saturating_sub(1).min(u32::MAX as u64) as u32;
    h[1024..1028].copy_from_slice(&1u32.to_ne_bytes()); // version
    h[1028..1032].copy_from_slice(&last_page.to_ne_bytes());
    // nr_badpages (1032) stays 0; uuid (1036..1052) stays zero.
    let label = &label.as_bytes()[..label.len().min(15)];
    h[1052..1052 + label.len()].copy_from_slice(label);
    h[page - 10..].copy_from_slice(b"SWAPSPACE2");
    h
}

/// The label of the swap area at `path` ("" if none).
pub fn read_label(path: &Path) -> String {
    let Ok(f) = File::open(path) else {
        return String::new();
    };
    let mut buf = [0u8; 16];
    if f.read_exact_at(&mut buf, 1052).is_err() {
        return String::new();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

fn write_header(f: &File, size: u64, path: &Path) -> Result<(), String> {
    if size < 16 * page_size() as u64 {
        return Err(format!(
            "swap device {} too small ({size} bytes)",
            path.display()
        ));
    }
    let h = header(size, &format!("{LABEL_PREFIX}{}", std::process::id()));
    f.write_all_at(&h, 0)
        .and_then(|()| f.sync_all())
        .map_err(|e| format!("writing the swap header of {}: {e}", path.display()))
}

fn page_size() -> usize {
    sys::sysconf(libc::_SC_PAGESIZE) as usize
}

/// Allocates `size` bytes of `file` on disk (fallocate, mode 0): not sparse.
fn allocate(file: &File, size: u64) -> bool {
    // SAFETY: the descriptor belongs to `file`, which the borrow keeps open
    // for the call; fallocate takes no pointers.
    unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, size as libc::off_t) == 0 }
}

/// swapon(2) of `path` with `flags`; its result (0, or -1 with errno set).
fn swapon(path: &CStr, flags: libc::c_int) -> libc::c_int {
    // SAFETY: `path` is NUL-terminated and borrowed for the call; swapon
    // only reads it.
    unsafe { libc::swapon(path.as_ptr(), flags) }
}

fn unused_file_name(dir: &Path) -> PathBuf {
    static MADE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    dir.join(format!("{FILE_PREFIX}{}-{n}.swap", std::process::id()))
}

/// Fails unless `dir` is a directory on a filesystem that can hold swap.
pub fn check_swap_dir(dir: &Path) -> Result<(), String> {
    if !dir.is_dir() {
        return Err(format!("swap directory {} does not exist", dir.display()));
    }
    let fs = sys::statfs(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if fs.f_type as i64 == TMPFS_MAGIC {
        return Err(format!(
            "{} is on tmpfs, which cannot hold a swap file (pass --swap-dir on a disk)",
            dir.display()
        ));
    }
    Ok(())
}

/// Leaves at least 1 GiB free beside the swap file.
fn check_free_space(dir: &Path, size: u64) -> Result<(), String> {
    let fs = sys::statvfs(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let free = fs.f_bavail as u64 * fs.f_frsize as u64;
    if free < size + (1 << 30) {
        return Err(format!(
            "{} has {} MiB free: too little for a {} MiB swap file",
            dir.display(),
            free >> 20,
            size >> 20
        ));
    }
    Ok(())
}

/// zram devices: /sys/block/zramN, sorted.
fn zram_devices() -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir("/sys/block") else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("zram"))
        })
        .collect();
    out.sort();
    out
}

fn zram_free(sysfs: &Path) -> bool {
    std::fs::read_to_string(sysfs.join("disksize")).is_ok_and(|s| s.trim() == "0")
}

/// The algorithms a zram device offers.
fn zram_algorithms(sysfs: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(sysfs.join("comp_algorithm")).unwrap_or_default();
    text.split_whitespace()
        .map(|w| w.trim_matches(|c| c == '[' || c == ']').to_string())
        .collect()
}

/// Fails unless zram offers `algorithm` (every device offers the same list).
pub fn check_zram_algorithm(algorithm: &str) -> Result<(), String> {
    let Some(device) = zram_devices().into_iter().next() else {
        return Err("no zram device (load the zram module)".into());
    };
    let offered = zram_algorithms(&device);
    if !offered.iter().any(|a| a == algorithm) {
        return Err(format!(
            "zram offers no algorithm '{algorithm}' (offered: {})",
            offered.join(", ")
        ));
    }
    Ok(())
}

/// Fails unless a zram device is free (no disksize). Check with the lock
/// held: our own devices come and go.
pub fn check_zram_free(_lock: &SwapLock) -> Result<(), String> {
    match zram_devices().iter().any(|d| zram_free(d)) {
        true => Ok(()),
        false => Err(
            "no free zram device (every /sys/block/zram* has a disksize, and not from us)".into(),
        ),
    }
}

/// Sets up the first free zram device: the write of disksize is the claim
/// (the kernel refuses it with EBUSY on a device in use).
fn claim_zram(size: u64, algorithm: &str) -> Result<PathBuf, String> {
    check_zram_algorithm(algorithm)?;
    for sysfs in zram_devices().into_iter().filter(|d| zram_free(d)) {
        if std::fs::write(sysfs.join("comp_algorithm"), algorithm).is_err() {
            continue;
        }
        match std::fs::write(sysfs.join("disksize"), size.to_string()) {
            Ok(()) => return Ok(sysfs),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => continue,
            Err(e) => return Err(format!("setting {}/disksize: {e}", sysfs.display())),
        }
    }
    Err("no free zram device (all claimed meanwhile)".into())
}

/// One line of /proc/swaps.
#[derive(Clone, Debug, Serialize)]
pub struct ActiveSwap {
    pub path: PathBuf,
    pub kind: String,
    pub size_bytes: u64,
    pub used_bytes: u64,
    pub priority: i32,
}

/// The swap areas active now.
pub fn active_swaps() -> Vec<ActiveSwap> {
    let text = std::fs::read_to_string("/proc/swaps").unwrap_or_default();
    text.lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some(ActiveSwap {
                path: PathBuf::from(unescape(f.first()?)),
                kind: f.get(1)?.to_string(),
                size_bytes: f.get(2)?.parse::<u64>().ok()? * 1024,
                used_bytes: f.get(3)?.parse::<u64>().ok()? * 1024,
                priority: f.get(4)?.parse().ok()?,
            })
        })
        .collect()
}

/// /proc/swaps writes blanks and backslashes in paths as octal escapes.
fn unescape(s: &str) -> String {
    let mut out = Vec::new();
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| b[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) => {
                out.push(d.iter().fold(0u8, |a, c| a.wrapping_mul(8) + (c - b'0')));
                i += 4;
            }
            None => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The pid that made the swap area, if it is one of ours.
fn owner(swap: &ActiveSwap) -> Option<u32> {
    let name = swap.path.file_name()?.to_string_lossy().into_owned();
    if let Some(rest) = name.strip_prefix(FILE_PREFIX) {
        return rest.split('-').next()?.parse().ok();
    }
    read_label(&swap.path)
        .strip_prefix(LABEL_PREFIX)?
        .parse()
        .ok()
}

/// Active swap areas that are not ours.
pub fn foreign_swaps() -> Vec<ActiveSwap> {
    active_swaps()
        .into_iter()
        .filter(|s| owner(s).is_none())
        .collect()
}

/// Swaps off and removes our areas whose harness is gone (SIGKILLed);
/// returns what was removed. Call with the lock held.
pub fn sweep_leftovers(_lock: &SwapLock) -> Vec<String> {
    let mut swept = Vec::new();
    for swap in active_swaps() {
        let Some(pid) = owner(&swap) else { continue };
        if pid == std::process::id() || sys::pid_alive(pid) {
            continue;
        }
        let zram = swap
            .path
            .file_name()
            .map(|n| n.to_string_lossy().starts_with("zram"))
            .unwrap_or(false);
        let reset = zram.then(|| {
            c_path(
                &Path::new("/sys/block")
                    .join(swap.path.file_name().unwrap_or_default())
                    .join("reset"),
            )
        });
        let removal = Removal {
            path: c_path(&swap.path),
            file: !zram,
            reset,
        };
        match removal.teardown() {
            Ok(()) => swept.push(format!("swap {}", swap.path.display())),
            Err(f) => eprintln!(
                "bench: could not remove leftover swap {}: {f}",
                swap.path.display()
            ),
        }
    }
    swept
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Serialises the swap tests (and waits for a harness that runs meanwhile).
    pub(crate) fn lock() -> SwapLock {
        SwapLock::acquire(Duration::from_secs(1800)).unwrap()
    }

    pub(crate) fn ours_active() -> Vec<ActiveSwap> {
        active_swaps()
            .into_iter()
            .filter(|s| owner(s) == Some(std::process::id()))
            .collect()
    }

    #[test]
    fn header_has_version_last_page_label_and_magic() {
        let page = page_size();
        let h = header(64 << 20, "pagefold-1234");
        assert_eq!(h.len(), page);
        assert_eq!(u32::from_ne_bytes(h[1024..1028].try_into().unwrap()), 1);
        assert_eq!(
            u32::from_ne_bytes(h[1028..1032].try_into().unwrap()) as u64,
            (64 << 20) / page as u64 - 1
        );
        assert_eq!(&h[1052..1065], b"pagefold-1234");
        assert_eq!(&h[page - 10..], b"SWAPSPACE2");
    }

    #[test]
    fn proc_swaps_paths_are_unescaped() {
        assert_eq!(unescape(r"/var/tmp/a\040b.swap"), "/var/tmp/a b.swap");
        assert_eq!(unescape("/dev/zram0"), "/dev/zram0");
    }

    #[test]
    fn tmpfs_and_missing_directories_are_refused() {
        let err = check_swap_dir(Path::new("/nonexistent-pagefold")).unwrap_err();
        assert!(err.contains("does not exist"), "{err}");
        if Path::new("/dev/shm").is_dir() {
            let err = check_swap_dir(Path::new("/dev/shm")).unwrap_err();
            assert!(err.contains("tmpfs"), "{err}");
        }
    }

    fn skip() -> bool {
        if let Err(why) = crate::cgroup::check_available() {
            eprintln!("skipped: {why}");
            return true;
        }
        false
    }

    #[test]
    fn a_swap_file_is_active_then_gone() {
        if skip() {
            return;
        }
        let lock = lock();
        let dev = SwapDevice::file(&lock, Path::new("/var/tmp"), 32 << 20).unwrap();
        let path = dev.path().to_path_buf();
        let active = ours_active();
        assert!(
            active
                .iter()
                .any(|s| s.path == path && s.priority == PRIORITY),
            "{active:?}"
        );
        assert_eq!(
            read_label(&path),
            format!("pagefold-{}", std::process::id())
        );
        dev.remove().unwrap();
        assert!(ours_active().is_empty() && !path.exists());
    }

    #[test]
    fn a_zram_device_is_active_then_reset() {
        if skip() {
            return;
        }
        let lock = lock();
        if let Err(why) = check_zram_algorithm("lz4").and_then(|()| check_zram_free(&lock)) {
            return eprintln!("skipped: {why}");
        }
        let dev = SwapDevice::zram(&lock, 32 << 20, "lz4").unwrap();
        let sysfs = Path::new("/sys/block").join(dev.path().file_name().unwrap());
        assert!(ours_active().iter().any(|s| s.path == dev.path()));
        assert!(std::fs::read_to_string(sysfs.join("comp_algorithm"))
            .unwrap()
            .contains("[lz4]"));
        assert!(dev.zram_stats().is_some());
        dev.remove().unwrap();
        assert!(ours_active().is_empty());
        assert_eq!(
            std::fs::read_to_string(sysfs.join("disksize"))
                .unwrap()
                .trim(),
            "0"
        );
    }

    #[test]
    fn a_leftover_swap_file_of_a_dead_harness_is_swept() {
        if skip() {
            return;
        }
        let lock = lock();
        let mut dead = std::process::Command::new("true").spawn().unwrap();
        let pid = dead.id();
        dead.wait().unwrap();
        // Made as a SIGKILLed harness would have left it: active, named after its pid.
        let path = Path::new("/var/tmp").join(format!("{FILE_PREFIX}{pid}-0.swap"));
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .unwrap();
        // Removes it even if an assertion below fails (after the sweep: nothing left to do).
        let _cleanup = teardown::register(Box::new(Removal {
            path: c_path(&path),
            file: true,
            reset: None,
        }))
        .unwrap();
        assert!(allocate(&file, 16 << 20));
        file.write_all_at(&header(16 << 20, &format!("{LABEL_PREFIX}{pid}")), 0)
            .unwrap();
        drop(file);
        assert_eq!(
            swapon(&c_path(&path), 0),
            0,
            "swapon: {}",
            std::io::Error::last_os_error()
        );
        let swept = sweep_leftovers(&lock);
        assert!(
            swept
                .iter()
                .any(|s| s.contains(&path.display().to_string())),
            "{swept:?}"
        );
        assert!(!path.exists());
        assert!(!active_swaps().iter().any(|s| s.path == path));
    }
}
