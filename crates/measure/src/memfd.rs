//! memfd (shmem) accounting. pagefold's engine keeps page frames in a memfd;
//! its pages live in the page cache of that file, and a page the process does
//! not map at the moment (a frame no block points at, or one only read
//! through pread) is invisible to pagemap although it still costs memory.
//! So a memfd's pages are counted from the file instead: st_blocks * 512
//! bytes covers every page allocated to it, mapped or not (and, on a machine
//! with swap, swapped-out ones).
//!
//! Memfds are found two ways: mappings whose path starts with `/memfd:`,
//! stat'ed through /proc/PID/map_files/START-END (needs root), and open file
//! descriptors whose /proc/PID/fd/N link names `/memfd:`, stat'ed through the
//! link. Each inode (st_dev, st_ino) is counted once, however many mappings,
//! descriptors or processes reach it. A memfd mapping whose file could not be
//! stat'ed is not "accounted": its page-cache pages are then counted by PFN
//! like any other page, so nothing is lost, only unmapped pages are missed.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::error::Error;
use crate::procfs::{self, Mapping};

/// Identity of an inode: (st_dev, st_ino).
pub(crate) type InodeKey = (u64, u64);

/// The memfds one process reaches.
#[derive(Debug, Default)]
pub(crate) struct Memfds {
    /// Allocated bytes (st_blocks * 512) of every memfd inode found.
    pub bytes_by_inode: HashMap<InodeKey, u64>,
    /// Memfd inodes (as maps names them) whose mappings are accounted here,
    /// so their page-cache pages must not be counted again by PFN.
    accounted_mappings: HashSet<InodeKey>,
}

impl Memfds {
    /// True if this mapping's page-cache pages are counted via st_blocks.
    pub fn accounts(&self, mapping: &Mapping) -> bool {
        mapping.is_memfd()
            && self
                .accounted_mappings
                .contains(&(mapping.dev, mapping.inode))
    }
}

/// Finds the memfds of `pid` through its mappings and its descriptors.
pub(crate) fn find_memfds(pid: u32, mappings: &[Mapping]) -> Result<Memfds, Error> {
    let mut memfds = Memfds::default();
    add_mapped(pid, mappings, &mut memfds);
    add_open(pid, &mut memfds)?;
    Ok(memfds)
}

fn add_mapped(pid: u32, mappings: &[Mapping], memfds: &mut Memfds) {
    let mut denied = HashSet::new();
    for mapping in mappings.iter().filter(|m| m.is_memfd()) {
        let maps_key = (mapping.dev, mapping.inode);
        // One stat per inode (the engine maps one memfd many times), but a
        // mapping that went away since maps was read (ENOENT) must not leave
        // the inode unaccounted: its pages would be counted twice, by PFN
        // and by st_blocks. So the next mapping of the inode is tried.
        if memfds.accounted_mappings.contains(&maps_key) || denied.contains(&maps_key) {
            continue;
        }
        let link = format!(
            "/proc/{pid}/map_files/{:x}-{:x}",
            mapping.start, mapping.end
        );
        match stat_inode(Path::new(&link)) {
            Ok((key, bytes)) => {
                memfds.bytes_by_inode.insert(key, bytes);
                memfds.accounted_mappings.insert(maps_key);
            }
            // Without root no mapping of it will do: not accounted.
            Err(e)
                if e.raw_os_error() == Some(libc::EPERM)
                    || e.raw_os_error() == Some(libc::EACCES) =>
            {
                denied.insert(maps_key);
            }
            Err(_) => {}
        }
    }
}

fn add_open(pid: u32, memfds: &mut Memfds) -> Result<(), Error> {
    let dir = procfs::proc_path(pid, "fd");
    let entries = match fs::read_dir(&dir) {
        Ok(entries) => entries,
        // Descriptors are extra information; maps was readable, so carry on.
        Err(e) if e.raw_os_error() == Some(libc::EACCES) => return Ok(()),
        Err(e) => return Err(Error::from_proc_io(pid, dir, e)),
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let names_memfd = fs::read_link(&path)
            .map(|target| {
                target
                    .as_os_str()
                    .as_encoded_bytes()
                    .starts_with(b"/memfd:")
            })
            .unwrap_or(false);
        // A descriptor closed in between simply fails to stat.
        if let Some((key, bytes)) = names_memfd.then(|| stat_inode(&path).ok()).flatten() {
            memfds.bytes_by_inode.insert(key, bytes);
        }
    }
    Ok(())
}

/// (inode identity, allocated bytes) of the file a /proc link points at.
fn stat_inode(link: &Path) -> std::io::Result<(InodeKey, u64)> {
    let meta = fs::metadata(link)?;
    Ok(((meta.dev(), meta.ino()), meta.blocks() * 512))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The maps line read before a mapping went away must not leave the
    /// memfd unaccounted while another mapping of it still exists.
    #[test]
    fn a_vanished_first_mapping_does_not_unaccount_the_memfd() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: map_files needs root");
            return;
        }
        // SAFETY: a NUL-terminated name and no flags.
        let fd = unsafe { libc::memfd_create(c"pf-measure-test".as_ptr(), 0) };
        assert!(fd >= 0);
        // SAFETY: fd is the memfd just created, owned by this test.
        let sized = unsafe { libc::ftruncate(fd, 1 << 20) };
        assert_eq!(sized, 0);
        // SAFETY: a new shared read-only mapping of the memfd at an address
        // the kernel picks; it replaces nothing.
        let map = || unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                1 << 16,
                libc::PROT_READ,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        let (gone, live) = (map(), map());
        let pid = std::process::id();
        let maps = procfs::parse_maps(&procfs::read_text(pid, "maps").unwrap());
        let mut ours: Vec<Mapping> = maps
            .into_iter()
            .filter(|m| m.start == gone as u64 || m.start == live as u64)
            .collect();
        ours.sort_by_key(|m| m.start != gone as u64);
        assert_eq!(ours.len(), 2);
        // SAFETY: both mappings were found in maps, so `gone` is the live
        // 64 KiB mapping made above; nothing refers into it.
        unsafe { libc::munmap(gone, 1 << 16) };
        let mut memfds = Memfds::default();
        add_mapped(pid, &ours, &mut memfds);
        assert!(
            memfds.accounts(&ours[1]),
            "the second mapping of the inode was not tried"
        );
        // SAFETY: `live` is the other 64 KiB mapping made above, unused from
        // here on, and fd the memfd this test created and still owns.
        unsafe {
            libc::munmap(live, 1 << 16);
            libc::close(fd);
        }
    }
}
