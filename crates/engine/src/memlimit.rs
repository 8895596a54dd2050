//! The memory a process may use, how much of it is in use, and how much the
//! process stalls for memory: what pressure-driven tiering (pressure.rs)
//! reads, and what `pagefold doctor` reports.
//!
//! The limit is the process's memory cgroup's. Under cgroup v2 (the line
//! `0::PATH` of /proc/self/cgroup, under the cgroup2 mount) it is the
//! smallest `memory.max` or `memory.high` of the group and its ancestors;
//! under cgroup v1 (the line naming the `memory` controller, under the mount
//! whose options name it) it is `hierarchical_memory_limit` of memory.stat,
//! else `memory.limit_in_bytes`. `max`, or a value of 2^60 bytes or more
//! (v1's "unlimited" is 2^63 rounded to pages), is no limit. Mounts come from
//! /proc/self/mountinfo, so a hybrid layout (v1 controllers beside a cgroup2
//! mount at /sys/fs/cgroup/unified) is read right.
//!
//! The usage set against it is the group's *working set*: `memory.current`
//! (v1: `memory.usage_in_bytes`) less the inactive page cache
//! (`inactive_file`, v1 `total_inactive_file`), which the kernel drops
//! before it touches anonymous memory; without this, a program that reads a
//! large file would look short of memory.
//!
//! Pressure is PSI's `some avg10`: the share of the last ten seconds in
//! which at least one task of the group waited for memory, from the group's
//! `memory.pressure` (cgroup v2), else the machine's /proc/pressure/memory.
//!
//! Everything here reads text and parses it with pure functions, so the
//! tests feed them real files copied into a temporary directory as well as
//! the live ones. The functions that read take the reader as an argument
//! (`Read`): `pagefold doctor` opens each file as it reads it, while the
//! engine's gauge reads descriptors it opened once at engine start
//! (pressure.rs), as its background thread must never open a file.

use std::path::{Path, PathBuf};

/// Values at or above this are "no limit" (cgroup v1 writes 2^63 - 4096).
pub const UNLIMITED: u64 = 1 << 60;

/// Which cgroup hierarchy a group lives in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    V1,
    V2,
}

/// The process's memory cgroup: its directory and the mount it lies under.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Group {
    pub version: Version,
    pub dir: PathBuf,
    pub mount: PathBuf,
}

/// Where the files describing the process are (the live ones, or copies).
#[derive(Clone, Debug)]
pub struct Sources {
    pub proc_cgroup: PathBuf,
    pub mountinfo: PathBuf,
    pub meminfo: PathBuf,
    pub statm: PathBuf,
    pub system_psi: PathBuf,
}

impl Default for Sources {
    fn default() -> Self {
        Sources {
            proc_cgroup: "/proc/self/cgroup".into(),
            mountinfo: "/proc/self/mountinfo".into(),
            meminfo: "/proc/meminfo".into(),
            statm: "/proc/self/statm".into(),
            system_psi: "/proc/pressure/memory".into(),
        }
    }
}

/// `4G`, `512M`, `64k`, `1048576` (K/M/G/T are powers of 1024; an optional
/// `B` or `iB` may follow) as bytes; the error says what is wrong in one line.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (number, unit) = t.split_at(digits);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("'{text}' is not a size (a number with K, M, G or T: 4G, 512M)"))?;
    let shift = match unit.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        u => return Err(format!("'{text}': unknown unit '{u}' (K, M, G or T)")),
    };
    let bytes = number
        .checked_mul(1 << shift)
        .ok_or_else(|| format!("'{text}' is too large"))?;
    if bytes < crate::sys::PAGE as u64 {
        return Err(format!("'{text}' is less than a page"));
    }
    Ok(bytes)
}

/// From /proc/self/cgroup: the v2 path (`0::PATH`) and the v1 memory
/// controller's path (`N:...memory...:PATH`).
pub fn cgroup_paths(proc_cgroup: &str) -> (Option<String>, Option<String>) {
    let (mut v2, mut v1) = (None, None);
    for line in proc_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if controllers.is_empty() {
            v2 = Some(path.to_string());
        } else if controllers.split(',').any(|c| c == "memory") {
            v1 = Some(path.to_string());
        }
    }
    (v2, v1)
}

/// A mount: the path of the hierarchy it shows (its root) and where it is.
pub type Mount = (String, PathBuf);

/// From /proc/self/mountinfo: where cgroup2 is mounted, and where the v1
/// hierarchy with the memory controller is.
pub fn cgroup_mounts(mountinfo: &str) -> (Option<Mount>, Option<Mount>) {
    let (mut v2, mut v1) = (None, None);
    for line in mountinfo.lines() {
        // ID PARENT MAJ:MIN ROOT POINT OPTIONS [OPTIONAL...] - TYPE SOURCE SUPER
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let fields: Vec<&str> = left.split(' ').collect();
        let tail: Vec<&str> = right.split(' ').collect();
        if fields.len() < 5 || tail.is_empty() {
            continue;
        }
        let mount = (unescape(fields[3]), PathBuf::from(unescape(fields[4])));
        match tail[0] {
            "cgroup2" if v2.is_none() => v2 = Some(mount),
            "cgroup"
                if v1.is_none()
                    && tail
                        .get(2)
                        .is_some_and(|o| o.split(',').any(|c| c == "memory")) =>
            {
                v1 = Some(mount)
            }
            _ => {}
        }
    }
    (v2, v1)
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape(field: &str) -> String {
    let mut out = String::new();
    let mut rest = field;
    while let Some(i) = rest.find('\\') {
        out += &rest[..i];
        match u8::from_str_radix(rest.get(i + 1..i + 4).unwrap_or(""), 8) {
            Ok(b) => {
                out.push(b as char);
                rest = &rest[i + 4..];
            }
            Err(_) => {
                out.push('\\');
                rest = &rest[i + 1..];
            }
        }
    }
    out + rest
}

/// The directory of the group whose path is `path`, under a mount of `root` at `point`.
fn group_dir(point: &Path, root: &str, path: &str) -> PathBuf {
    let inner = path.strip_prefix(root).unwrap_or(path);
    point.join(inner.trim_start_matches('/'))
}

/// The process's memory cgroup as the two files describe it: the v1
/// memory controller's group if one is mounted (then v2 has no memory
/// controller), else the v2 group.
pub fn find_group(proc_cgroup: &str, mountinfo: &str) -> Option<Group> {
    let (v2_path, v1_path) = cgroup_paths(proc_cgroup);
    let (v2_mount, v1_mount) = cgroup_mounts(mountinfo);
    if let (Some(path), Some((root, point))) = (v1_path, v1_mount) {
        return Some(Group {
            version: Version::V1,
            dir: group_dir(&point, &root, &path),
            mount: point,
        });
    }
    let (path, (root, point)) = (v2_path?, v2_mount?);
    Some(Group {
        version: Version::V2,
        dir: group_dir(&point, &root, &path),
        mount: point,
    })
}

/// The live group (None when /proc cannot be read or no hierarchy is mounted).
pub fn live_group(src: &Sources) -> Option<Group> {
    let cgroup = std::fs::read_to_string(&src.proc_cgroup).ok()?;
    let mountinfo = std::fs::read_to_string(&src.mountinfo).ok()?;
    find_group(&cgroup, &mountinfo)
}

/// A limit file's value: None for `max`, unreadable or 2^60 and above.
pub fn parse_limit(text: &str) -> Option<u64> {
    text.trim().parse::<u64>().ok().filter(|&b| b < UNLIMITED)
}

/// The value of `key` in a memory.stat-like file (`key value` lines).
pub fn stat_value(text: &str, key: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.trim().parse().ok())
}

/// How a look at memory gets a file's text: `read_path` opens the file
/// (`pagefold doctor`, tests); the pressure gauge reads descriptors it
/// opened once (pressure.rs).
pub type Read<'a> = &'a dyn Fn(&Path) -> Option<String>;

/// Reads the file at `path` now.
pub fn read_path(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

impl Group {
    /// The files `limit_from` reads: the group's own first, then (v2) its
    /// ancestors' up to the mount.
    pub fn limit_files(&self) -> Vec<PathBuf> {
        match self.version {
            Version::V1 => ["memory.stat", "memory.limit_in_bytes"]
                .map(|f| self.dir.join(f))
                .to_vec(),
            Version::V2 => self
                .dir
                .ancestors()
                .take_while(|d| d.starts_with(&self.mount))
                .flat_map(|d| ["memory.max", "memory.high"].map(|f| d.join(f)))
                .collect(),
        }
    }

    /// The files `working_set_from` reads: the usage and memory.stat.
    pub fn usage_files(&self) -> [PathBuf; 2] {
        let usage = match self.version {
            Version::V1 => "memory.usage_in_bytes",
            Version::V2 => "memory.current",
        };
        [self.dir.join(usage), self.dir.join("memory.stat")]
    }

    /// The limit that binds the group (see the module comment), if any.
    pub fn limit(&self) -> Option<u64> {
        self.limit_from(&read_path)
    }

    /// `limit`, with the files' text from `read`.
    pub fn limit_from(&self, read: Read) -> Option<u64> {
        let files = self.limit_files();
        match self.version {
            Version::V1 => {
                let stat = read(&files[0]).unwrap_or_default();
                stat_value(&stat, "hierarchical_memory_limit")
                    .filter(|&b| b < UNLIMITED)
                    .or_else(|| parse_limit(&read(&files[1])?))
            }
            Version::V2 => files.iter().filter_map(|f| parse_limit(&read(f)?)).min(),
        }
    }

    /// The group's working set: its usage less inactive page cache.
    pub fn working_set(&self) -> Option<u64> {
        self.working_set_from(&read_path)
    }

    /// `working_set`, with the files' text from `read`.
    pub fn working_set_from(&self, read: Read) -> Option<u64> {
        let inactive = match self.version {
            Version::V1 => "total_inactive_file",
            Version::V2 => "inactive_file",
        };
        let [usage, stat] = self.usage_files();
        let used: u64 = read(&usage)?.trim().parse().ok()?;
        let stat = read(&stat).unwrap_or_default();
        Some(used.saturating_sub(stat_value(&stat, inactive).unwrap_or(0)))
    }

    /// The group's own memory.pressure (cgroup v2, below the root: the
    /// root's is the machine's).
    pub fn psi_file(&self) -> Option<PathBuf> {
        let f = self.dir.join("memory.pressure");
        (self.version == Version::V2 && self.dir != self.mount && f.is_file()).then_some(f)
    }
}

/// `some avg10` of a PSI file's text, in percent.
pub fn parse_psi(text: &str) -> Option<f64> {
    let line = text.lines().find(|l| l.starts_with("some "))?;
    line.split(' ')
        .find_map(|f| f.strip_prefix("avg10="))?
        .parse()
        .ok()
}

/// The machine's memory from /proc/meminfo: (MemTotal, MemTotal - MemAvailable), bytes.
pub fn parse_meminfo(text: &str) -> Option<(u64, u64)> {
    let kib = |key: &str| {
        text.lines().find_map(|l| {
            l.strip_prefix(key)?
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
    };
    let total = kib("MemTotal:")? << 10;
    let available = kib("MemAvailable:")? << 10;
    Some((total, total.saturating_sub(available)))
}

/// The machine's free swap from /proc/meminfo (`SwapFree`), bytes.
pub fn parse_swap_free(text: &str) -> Option<u64> {
    let line = text.lines().find_map(|l| l.strip_prefix("SwapFree:"))?;
    let kib: u64 = line.trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kib << 10)
}

/// Resident bytes of this process, from /proc/self/statm (its second
/// field, in pages).
pub fn parse_statm(text: &str) -> Option<u64> {
    let pages: u64 = text.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * crate::sys::PAGE as u64)
}

/// Where a limit came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// The memory cgroup's limit, against its working set.
    Cgroup,
    /// `PAGEFOLD_MEMORY`, against the process's resident memory.
    User,
    /// None known: the machine's memory, against what is not available.
    Machine,
}

/// The limit that binds and the usage set against it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Binding {
    pub source: Source,
    pub limit: u64,
    pub used: u64,
}

/// The smallest of the cgroup's limit (`group`, unless hidden), the user's
/// and, failing both, the machine's, each with its usage; a tie goes to the
/// cgroup, whose usage counts every process of the group. Files are read
/// with `read`.
pub fn binding(
    src: &Sources,
    group: Option<&Group>,
    user: Option<u64>,
    read: Read,
) -> Option<Binding> {
    let cgroup = group.and_then(|g| {
        Some(Binding {
            source: Source::Cgroup,
            limit: g.limit_from(read)?,
            used: g.working_set_from(read)?,
        })
    });
    let own = || parse_statm(&read(&src.statm)?);
    let user = user.and_then(|limit| {
        Some(Binding {
            source: Source::User,
            limit,
            used: own()?,
        })
    });
    match (cgroup, user) {
        (Some(c), Some(u)) => Some(if u.limit < c.limit { u } else { c }),
        (Some(b), None) | (None, Some(b)) => Some(b),
        (None, None) => {
            let (limit, used) = parse_meminfo(&read(&src.meminfo)?)?;
            Some(Binding {
                source: Source::Machine,
                limit,
                used,
            })
        }
    }
}

/// One line on the group's limit, for `pagefold doctor`.
pub fn describe(group: Option<&Group>) -> String {
    let Some(g) = group else {
        return "no memory cgroup found (/proc/self/cgroup, /proc/self/mountinfo)".into();
    };
    let v = match g.version {
        Version::V1 => "v1",
        Version::V2 => "v2",
    };
    match (g.limit(), g.working_set()) {
        (Some(l), Some(u)) => format!(
            "{:.0} MiB, {:.0} MiB in use (cgroup {v} {})",
            l as f64 / (1 << 20) as f64,
            u as f64 / (1 << 20) as f64,
            g.dir.display()
        ),
        (Some(l), None) => format!(
            "{:.0} MiB (cgroup {v} {})",
            l as f64 / (1 << 20) as f64,
            g.dir.display()
        ),
        (None, _) => format!("no memory limit (cgroup {v} {})", g.dir.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_binary_suffixes_and_refuse_junk() {
        assert_eq!(parse_bytes("4G"), Ok(4 << 30));
        assert_eq!(parse_bytes("512m"), Ok(512 << 20));
        assert_eq!(parse_bytes("64KiB"), Ok(64 << 10));
        assert_eq!(parse_bytes(" 1048576 "), Ok(1 << 20));
        for bad in ["junk", "", "G", "4X", "-1G", "1.5G", "99999999999T", "12"] {
            let e = parse_bytes(bad).expect_err(bad);
            assert!(!e.contains('\n'), "{e}");
        }
    }

    #[test]
    fn hybrid_layout_picks_the_v1_memory_controller() {
        let cgroup = "9:name=systemd:/\n4:memory:/jobs/a\n1:cpu:/\n0::/\n";
        let mountinfo =
            "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n\
                         41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";
        let g = find_group(cgroup, mountinfo).unwrap();
        assert_eq!(g.version, Version::V1);
        assert_eq!(g.dir, Path::new("/sys/fs/cgroup/memory/jobs/a"));
        let pure_v2 = "29 23 0:26 / /sys/fs/cgroup rw shared:4 - cgroup2 cgroup2 rw,nsdelegate\n";
        let g = find_group("0::/user.slice/x.scope\n", pure_v2).unwrap();
        assert_eq!(g.version, Version::V2);
        assert_eq!(g.dir, Path::new("/sys/fs/cgroup/user.slice/x.scope"));
        // A container sees its group as the mount's root.
        let ns = "29 23 0:26 /kube/pod1 /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        let g = find_group("0::/kube/pod1\n", ns).unwrap();
        assert_eq!(g.dir, Path::new("/sys/fs/cgroup"));
        assert!(find_group("0::/\n", "").is_none(), "nothing mounted");
    }

    #[test]
    fn psi_meminfo_and_statm_parse() {
        let psi = "some avg10=1.25 avg60=0.50 avg300=0.14 total=25225411\n\
                   full avg10=0.00 avg60=0.00 avg300=0.14 total=17260649\n";
        assert_eq!(parse_psi(psi), Some(1.25));
        assert_eq!(parse_psi("full avg10=3.00\n"), None);
        let meminfo = "MemTotal:       24000000 kB\nMemFree:  1 kB\nMemAvailable:   18000000 kB\n";
        assert_eq!(parse_swap_free(meminfo), None);
        let swap = format!("{meminfo}SwapTotal: 2048 kB\nSwapFree:   1024 kB\n");
        assert_eq!(parse_swap_free(&swap), Some(1 << 20));
        assert_eq!(
            parse_meminfo(meminfo),
            Some((24_000_000 << 10, 6_000_000 << 10))
        );
        assert_eq!(parse_statm("100 25 3 1 0 50 0\n"), Some(25 * 4096));
        assert_eq!(parse_limit("max\n"), None);
        assert_eq!(parse_limit("9223372036854771712\n"), None);
        assert_eq!(parse_limit("104857600\n"), Some(100 << 20));
        assert_eq!(unescape(r"/a\040b"), "/a b");
    }
}
