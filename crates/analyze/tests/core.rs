//! ELF core files: one written by the test with the `object` crate's ELF
//! writer (known segments, an NT_FILE note, a segment without file data),
//! and, when gdb's `gcore` is installed, a real core of a child process.

mod common;

use common::*;
use object::elf;
use object::write::elf::{FileHeader, ProgramHeader, Writer};
use object::Endianness;
use pagefold_analyze::PAGE;

/// A segment to write: address, flags, bytes (empty = no file data, `memsz`
/// pages in memory only).
pub struct Seg {
    pub vaddr: u64,
    pub flags: u32,
    pub data: Vec<u8>,
    pub memsz_pages: u64,
}

/// NT_FILE descriptor for 64-bit little-endian cores.
fn nt_file(files: &[(u64, u64, &str)]) -> Vec<u8> {
    let mut d = Vec::new();
    d.extend((files.len() as u64).to_le_bytes());
    d.extend((PAGE as u64).to_le_bytes());
    for (s, e, _) in files {
        d.extend(s.to_le_bytes());
        d.extend(e.to_le_bytes());
        d.extend(0u64.to_le_bytes());
    }
    for (_, _, name) in files {
        d.extend(name.as_bytes());
        d.push(0);
    }
    d
}

fn note(name: &[u8], n_type: u32, desc: &[u8]) -> Vec<u8> {
    let pad = |v: &mut Vec<u8>| {
        while !v.len().is_multiple_of(4) {
            v.push(0);
        }
    };
    let mut n = Vec::new();
    n.extend((name.len() as u32 + 1).to_le_bytes());
    n.extend((desc.len() as u32).to_le_bytes());
    n.extend(n_type.to_le_bytes());
    n.extend(name);
    n.push(0);
    pad(&mut n);
    n.extend(desc);
    pad(&mut n);
    n
}

/// Writes a 64-bit little-endian x86-64 ELF core.
pub fn write_core(segs: &[Seg], files: &[(u64, u64, &str)]) -> Vec<u8> {
    let mut buf = Vec::new();
    let mut w = Writer::new(Endianness::Little, true, &mut buf);
    w.reserve_file_header();
    w.reserve_program_headers(segs.len() as u32 + 1);
    let notes = note(b"CORE", elf::NT_FILE, &nt_file(files));
    let note_off = w.reserve(notes.len(), 4);
    let offs: Vec<usize> = segs.iter().map(|s| w.reserve(s.data.len(), PAGE)).collect();
    w.write_file_header(&FileHeader {
        os_abi: elf::ELFOSABI_NONE,
        abi_version: 0,
        e_type: elf::ET_CORE,
        e_machine: elf::EM_X86_64,
        e_entry: 0,
        e_flags: 0,
    })
    .unwrap();
    w.write_align_program_headers();
    w.write_program_header(&ProgramHeader {
        p_type: elf::PT_NOTE,
        p_flags: 0,
        p_offset: note_off as u64,
        p_vaddr: 0,
        p_paddr: 0,
        p_filesz: notes.len() as u64,
        p_memsz: 0,
        p_align: 4,
    });
    for (s, &off) in segs.iter().zip(&offs) {
        w.write_program_header(&ProgramHeader {
            p_type: elf::PT_LOAD,
            p_flags: s.flags,
            p_offset: off as u64,
            p_vaddr: s.vaddr,
            p_paddr: 0,
            p_filesz: s.data.len() as u64,
            p_memsz: s.memsz_pages.max(s.data.len() as u64 / PAGE as u64) * PAGE as u64,
            p_align: PAGE as u64,
        });
    }
    w.write_align(4);
    w.write(&notes);
    for s in segs {
        w.write_align(PAGE);
        w.write(&s.data);
    }
    buf
}

pub fn sample_core() -> (Vec<u8>, Composition) {
    let c = Composition {
        zero: 20,
        groups: vec![3, 4],
        unique: 10,
        families: vec![5],
        changed_bytes: 4,
    };
    let anon = build(&c, 21);
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(22);
    let text_page = random_page(&mut rng);
    let mut file = Vec::new();
    for _ in 0..8 {
        file.extend_from_slice(&text_page);
    }
    let segs = vec![
        Seg {
            vaddr: 0x10000,
            flags: elf::PF_R | elf::PF_W,
            data: anon,
            memsz_pages: 0,
        },
        Seg {
            vaddr: 0x400000,
            flags: elf::PF_R | elf::PF_X,
            data: file,
            memsz_pages: 0,
        },
        Seg {
            vaddr: 0x800000,
            flags: elf::PF_R,
            data: Vec::new(),
            memsz_pages: 16,
        },
    ];
    (
        write_core(&segs, &[(0x400000, 0x408000, "/usr/bin/example")]),
        c,
    )
}

#[test]
fn written_core_counts_are_exact() {
    let (core, c) = sample_core();
    let f = TempPath::write("test.core", &core);
    let v = json(&[&f.s(), "--only", "breakdown"]);
    assert_eq!(v["inputs"][0]["source"], "core");
    assert_eq!(
        v["inputs"][0]["mappings"], 2,
        "the segment without data is skipped"
    );
    // Anonymous pages of the composition + 8 identical file pages.
    assert_eq!(v["pages"], (c.pages() + 8) as u64);
    let b = &v["breakdown"];
    assert_eq!(b["zero_pages"], c.zero as u64);
    assert_eq!(b["sharable_pages"], 7 + 8);
    assert_eq!(b["sharable_distinct"], 3);
    assert_eq!(b["unique_pages"], c.unique_pages() as u64);
    assert_eq!(b["after_sharing"], (c.after_sharing() + 1) as u64);
    assert_eq!(b["patching"]["patched_pages"], 5);

    // NT_FILE tells file pages from anonymous ones.
    let file = json(&[&f.s(), "--only", "sharing", "--kind", "file"]);
    assert_eq!(file["pages"], 8);
    let anon = json(&[&f.s(), "--only", "sharing", "--kind", "anon"]);
    assert_eq!(anon["pages"], c.pages() as u64);
    // Range filter on virtual addresses.
    let r = json(&[&f.s(), "--only", "sharing", "--range", "0x401000-0x403000"]);
    assert_eq!(r["pages"], 2);
}

#[test]
fn gcore_of_a_child_is_read() {
    if std::process::Command::new("gcore")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("gcore not installed: skipped");
        return;
    }
    let c = Composition {
        zero: 16,
        groups: vec![4, 6],
        unique: 12,
        families: vec![3],
        changed_bytes: 4,
    };
    let data = build(&c, 31);
    let child = Child::spawn(&data, 0);
    let core = TempPath::new("gcore");
    let out = std::process::Command::new("gcore")
        .arg("-o")
        .arg(&core.0)
        .arg(child.pid.to_string())
        .output()
        .unwrap();
    let path = std::path::PathBuf::from(format!("{}.{}", core.s(), child.pid));
    let _cleanup = TempPath(path.clone());
    if !out.status.success() || !path.exists() {
        eprintln!(
            "gcore failed (ptrace not allowed here?): skipped: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        return;
    }
    let range = child.range();
    let v = json(&[
        path.to_str().unwrap(),
        "--only",
        "breakdown",
        "--range",
        &range,
    ]);
    assert_eq!(v["pages"], c.pages() as u64);
    let b = &v["breakdown"];
    assert_eq!(b["zero_pages"], c.zero as u64);
    assert_eq!(b["sharable_pages"], 10);
    assert_eq!(b["unique_pages"], c.unique_pages() as u64);
    assert_eq!(b["after_sharing"], c.after_sharing() as u64);
    assert_eq!(b["patching"]["patched_pages"], 3);
}
