//! ELF core files (from gcore, a kernel core dump, or anything that writes
//! the same layout): every PT_LOAD segment with file data is a run of pages
//! at its virtual address, with the segment's R/W/X flags as permissions.
//! Segments dumped without data (p_filesz 0, e.g. read-only file mappings the
//! kernel's coredump_filter left out) contribute nothing.
//!
//! The NT_FILE note, when present, lists the file-backed mappings; pages
//! inside one are kind `file`, others `anon` (a core has no [heap]/[stack]
//! names, so those filters select nothing from a core).
//!
//! The file is memory-mapped and parsed with the `object` crate; every
//! offset is checked against the file size first so that a cut-off core is
//! reported as truncated rather than read out of bounds.

use std::fs::File;
use std::path::Path;
use std::time::Instant;

use object::elf;
use object::read::elf::{FileHeader, ProgramHeader};
use object::Endianness;

use crate::error::{Error, Result};
use crate::image::{Buffer, Image, InputInfo, Kind, Perms, Region, PAGE};
use crate::read::filter::Filter;

const ELF_MAGIC: &[u8; 4] = b"\x7fELF";

/// True when the file starts with the ELF magic.
pub fn looks_like_elf(path: &Path) -> Result<bool> {
    use std::io::Read;
    let mut f = File::open(path).map_err(|e| Error::io(path, e))?;
    let mut magic = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        match f.read(&mut magic[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Error::io(path, e)),
        }
    }
    Ok(got == 4 && &magic == ELF_MAGIC)
}

/// One loadable segment with file data.
struct Segment {
    vaddr: u64,
    offset: u64,
    filesz: u64,
    perms: Perms,
}

/// Reads an ELF core file.
pub fn read(path: &Path, filter: &Filter) -> Result<Image> {
    let start = Instant::now();
    let file = File::open(path).map_err(|e| Error::io(path, e))?;
    let len = file.metadata().map_err(|e| Error::io(path, e))?.len();
    if len == 0 {
        return Err(Error::EmptyFile(path.to_path_buf()));
    }
    // SAFETY: the map is read-only; if the file is truncated by someone else
    // while mapped, reads fault (SIGBUS) — the same risk as every tool that
    // maps core files; the caller owns the file.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
    let data: &[u8] = &map;
    if data.len() < 4 || &data[..4] != ELF_MAGIC {
        return Err(Error::NotElf(path.to_path_buf()));
    }
    let class = data.get(4).copied().unwrap_or(0);
    let (segments, files) = match class {
        elf::ELFCLASS64 => parse::<elf::FileHeader64<Endianness>>(path, data)?,
        elf::ELFCLASS32 => parse::<elf::FileHeader32<Endianness>>(path, data)?,
        _ => return Err(bad(path, "unknown ELF class")),
    };

    let mut image = Image::new();
    let buf = image.add_buffer(Buffer::Map(map));
    let mut partial = 0u64;
    let mut mappings = 0;
    for s in &segments {
        let whole = s.filesz / PAGE as u64;
        partial += s.filesz % PAGE as u64;
        // Split the segment where file mappings start and end, so each run
        // has one kind.
        let mut cuts = vec![s.vaddr, s.vaddr + whole * PAGE as u64];
        for f in &files {
            for a in [f.0, f.1] {
                if a > s.vaddr && a < s.vaddr + whole * PAGE as u64 {
                    cuts.push(a & !(PAGE as u64 - 1));
                }
            }
        }
        cuts.sort_unstable();
        cuts.dedup();
        let mut used = false;
        for w in cuts.windows(2) {
            let (a, b) = (w[0], w[1]);
            let kind = if files.iter().any(|f| f.0 <= a && a < f.1) {
                Kind::File
            } else {
                Kind::Anon
            };
            if !filter.accepts_kind(kind) {
                continue;
            }
            for (ca, cb) in filter.clip(a, b) {
                let off = s.offset + (ca - s.vaddr);
                let pages = ((cb - ca) / PAGE as u64) as usize;
                let region = Region {
                    input: 0,
                    addr: ca,
                    first_page: 0,
                    pages: 0,
                    kind,
                    perms: s.perms,
                    name: None,
                };
                image.push_region(region, buf, off, pages, None);
                used = used || pages > 0;
            }
        }
        mappings += used as usize;
    }
    let pages = image.pages();
    image.inputs.push(InputInfo {
        name: path.display().to_string(),
        source: "core",
        pages,
        mappings,
        unpopulated_pages: 0,
        vanished_pages: 0,
        partial_bytes: partial,
        read_seconds: start.elapsed().as_secs_f64(),
        snapshot: None,
    });
    Ok(image)
}

fn bad(path: &Path, detail: impl Into<String>) -> Error {
    Error::BadElf {
        path: path.to_path_buf(),
        detail: detail.into(),
    }
}

fn truncated(path: &Path, detail: impl Into<String>) -> Error {
    Error::Truncated {
        path: path.to_path_buf(),
        detail: detail.into(),
    }
}

/// Loadable segments and the NT_FILE ranges (start, end) of a core.
/// Loadable segments and NT_FILE ranges.
type Parsed = (Vec<Segment>, Vec<(u64, u64)>);

fn parse<H: FileHeader<Endian = Endianness>>(path: &Path, data: &[u8]) -> Result<Parsed> {
    let len = data.len() as u64;
    if (data.len()) < std::mem::size_of::<H>() {
        return Err(truncated(
            path,
            format!("{len} bytes, shorter than an ELF header"),
        ));
    }
    let header = H::parse(data).map_err(|e| bad(path, e.to_string()))?;
    let endian = header.endian().map_err(|e| bad(path, e.to_string()))?;
    let e_type = header.e_type(endian);
    if e_type != elf::ET_CORE {
        let kind = match e_type {
            elf::ET_REL => "relocatable",
            elf::ET_EXEC => "executable",
            elf::ET_DYN => "shared object",
            _ => "unknown-type",
        };
        return Err(Error::NotCore {
            path: path.to_path_buf(),
            kind,
        });
    }
    let phoff: u64 = header.e_phoff(endian).into();
    let phnum = header.e_phnum(endian) as u64;
    let phentsize = header.e_phentsize(endian) as u64;
    if phoff.saturating_add(phnum.saturating_mul(phentsize)) > len {
        return Err(truncated(
            path,
            format!(
                "program headers end at byte {}, file has {len}",
                phoff + phnum * phentsize
            ),
        ));
    }
    let headers = header
        .program_headers(endian, data)
        .map_err(|e| bad(path, e.to_string()))?;
    let mut segments = Vec::new();
    let mut files = Vec::new();
    for ph in headers {
        let p_type = ph.p_type(endian);
        let offset: u64 = ph.p_offset(endian).into();
        let filesz: u64 = ph.p_filesz(endian).into();
        if p_type != elf::PT_LOAD && p_type != elf::PT_NOTE {
            continue;
        }
        if filesz == 0 {
            continue;
        }
        let end = offset
            .checked_add(filesz)
            .ok_or_else(|| bad(path, "segment size overflows"))?;
        if end > len {
            return Err(truncated(
                path,
                format!("segment at offset {offset:#x} needs {filesz} bytes, file has {len}"),
            ));
        }
        if p_type == elf::PT_NOTE {
            if let Ok(Some(mut notes)) = ph.notes(endian, data) {
                while let Ok(Some(note)) = notes.next() {
                    if note.n_type(endian) == elf::NT_FILE && note.name() == b"CORE" {
                        files.extend(parse_nt_file(note.desc(), H::is_type_64_sized(), endian));
                    }
                }
            }
            continue;
        }
        let flags = ph.p_flags(endian);
        segments.push(Segment {
            vaddr: ph.p_vaddr(endian).into(),
            offset,
            filesz,
            perms: Perms {
                read: flags & elf::PF_R != 0,
                write: flags & elf::PF_W != 0,
                exec: flags & elf::PF_X != 0,
                shared: false,
            },
        });
    }
    Ok((segments, files))
}

/// NT_FILE: count, page size, then count x (start, end, file offset) words,
/// then the file names. Returns the (start, end) ranges; a malformed note
/// yields what could be read.
fn parse_nt_file(desc: &[u8], is64: bool, endian: Endianness) -> Vec<(u64, u64)> {
    let w = if is64 { 8 } else { 4 };
    let word = |i: usize| -> Option<u64> {
        let b = desc.get(i * w..i * w + w)?;
        Some(if is64 {
            let a: [u8; 8] = b.try_into().ok()?;
            match endian {
                Endianness::Little => u64::from_le_bytes(a),
                Endianness::Big => u64::from_be_bytes(a),
            }
        } else {
            let a: [u8; 4] = b.try_into().ok()?;
            (match endian {
                Endianness::Little => u32::from_le_bytes(a),
                Endianness::Big => u32::from_be_bytes(a),
            }) as u64
        })
    };
    let mut out = Vec::new();
    let Some(count) = word(0) else { return out };
    for i in 0..count.min(1 << 20) as usize {
        match (word(2 + 3 * i), word(3 + 3 * i)) {
            (Some(s), Some(e)) if e > s => out.push((s, e)),
            (Some(_), Some(_)) => {}
            _ => break,
        }
    }
    out
}
