//! Every failure is one line `pagefold analyze: ...` on stderr, exit code 2,
//! no report and no panic: a missing PID, permission denied, an empty file,
//! a truncated core, a non-ELF file read as a core, an ELF file that is not
//! a core, an image whose size is not a page multiple, a missing file, bad
//! arguments. (A process exiting mid-read is in tests/live.rs.)

mod common;

use std::os::unix::process::CommandExt;

use common::*;
use pagefold_analyze::PAGE;

#[test]
fn missing_pid() {
    // A PID that just became free: a child that has exited and been reaped.
    let mut c = std::process::Command::new("true").spawn().unwrap();
    let pid = c.id();
    c.wait().unwrap();
    let out = run(&[&pid.to_string()]);
    assert_fails(&out, &format!("no such process: {pid}"));
}

#[test]
fn invalid_pid() {
    assert_fails(&run(&["0"]), "invalid PID: 0");
    assert_fails(&run(&["99999999999"]), "invalid PID");
}

#[test]
fn permission_denied() {
    // As root: run the analyzer as nobody against a child owned by root.
    // Otherwise: PID 1 belongs to root, not to us.
    // SAFETY: geteuid takes no arguments, touches no memory and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let child;
    let target = if root {
        child = Child::spawn(&vec![1u8; PAGE], 0);
        child.pid.to_string()
    } else {
        "1".to_string()
    };
    let mut cmd = bin();
    cmd.arg(&target).arg("-q");
    if root {
        // SAFETY: the closure runs in the forked child before exec and calls
        // only setgid, setuid and errno, which are async-signal-safe, and it
        // touches no memory shared with the parent's other threads.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setgid(65534) != 0 || libc::setuid(65534) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let out = match cmd.output() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("cannot run as nobody ({e}): skipped");
            return;
        }
    };
    assert_fails(&out, "permission denied reading /proc/");
}

#[test]
fn empty_file() {
    let f = TempPath::write("empty.img", b"");
    assert_fails(&run(&[&f.s()]), "file is empty");
    assert_fails(&run(&[&f.s(), "--format", "core"]), "file is empty");
}

#[test]
fn image_not_a_page_multiple() {
    let f = TempPath::write("odd.img", &vec![1u8; PAGE + 100]);
    assert_fails(
        &run(&[&f.s()]),
        "size 4196 bytes is not a multiple of the 4096-byte page size",
    );
}

#[test]
fn non_elf_file_as_core() {
    let f = TempPath::write("notelf.img", &vec![1u8; 2 * PAGE]);
    assert_fails(&run(&[&f.s(), "--format", "core"]), "not an ELF file");
    let tiny = TempPath::write("tiny", b"\x7fEL");
    assert_fails(&run(&[&tiny.s(), "--format", "core"]), "not an ELF file");
}

#[test]
fn elf_that_is_not_a_core() {
    let exe = env!("CARGO_BIN_EXE_pagefold-analyze");
    let out = run(&[exe]);
    assert_fails(&out, "not a core file");
}

#[test]
fn truncated_core() {
    // A core whose last segment is cut short, and one cut inside its headers.
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(1);
    let mut data = Vec::new();
    for _ in 0..8 {
        data.extend(random_page(&mut rng));
    }
    let core = write_small_core(&data);
    let cut = TempPath::write("cut.core", &core[..core.len() - 3 * PAGE]);
    assert_fails(&run(&[&cut.s()]), "truncated core file");
    let head = TempPath::write("head.core", &core[..100]);
    assert_fails(&run(&[&head.s()]), "truncated core file");
    let header_only = TempPath::write("hdr.core", &core[..40]);
    assert_fails(&run(&[&header_only.s()]), "truncated core file");
}

#[test]
fn missing_file_and_directory() {
    assert_fails(
        &run(&["/nonexistent/pagefold.img"]),
        "/nonexistent/pagefold.img: No such file or directory",
    );
    let d = std::env::temp_dir();
    assert_fails(&run(&[d.to_str().unwrap()]), "is a directory");
}

#[test]
fn bad_arguments() {
    let f = TempPath::write("args.img", &vec![1u8; PAGE]);
    assert_fails(&run(&[&f.s(), "--hsd", "2"]), "--hsd 2");
    assert_fails(&run(&[&f.s(), "--hsd", "0,1"]), "at least 1");
    assert_fails(&run(&[&f.s(), "--range", "10-5"]), "--range 10-5");
    assert_fails(
        &run(&[&f.s(), "--kind", "weird"]),
        "unknown mapping kind weird",
    );
    assert_fails(
        &run(&[&f.s(), "--only", "everything"]),
        "unknown analysis everything",
    );
    assert_fails(
        &run(&[&f.s(), "--patch-encoder", "gzip"]),
        "unknown --patch-encoder gzip",
    );
    assert_fails(
        &run(&[&f.s(), "--interval", "1"]),
        "--interval takes snapshots of processes",
    );
    assert_fails(
        &run(&[&f.s(), "--range", "0x100000-0x200000"]),
        "nothing to analyze",
    );
    assert_fails(
        &run(&[&f.s(), "--threads", "0"]),
        "--threads must be at least 1",
    );
    assert_fails(
        &run(&[&f.s(), "--fingerprints", "0"]),
        "--fingerprints 0: give a rate between 1 and",
    );
    assert_fails(
        &run(&[&f.s(), "--only", "fingerprints"]),
        "--only fingerprints needs --fingerprints RATE",
    );
}

#[test]
fn unwritable_plot_dir() {
    let f = TempPath::write("plot.img", &vec![1u8; PAGE]);
    let blocker = TempPath::write("blocker", b"x");
    let dir = format!("{}/sub", blocker.s());
    assert_fails(
        &run(&[&f.s(), "--only", "sharing", "--plot", &dir]),
        "cannot write plots to",
    );
}

/// A minimal 64-bit core with one PT_LOAD segment holding `data`.
fn write_small_core(data: &[u8]) -> Vec<u8> {
    use object::elf;
    use object::write::elf::{FileHeader, ProgramHeader, Writer};
    let mut buf = Vec::new();
    let mut w = Writer::new(object::Endianness::Little, true, &mut buf);
    w.reserve_file_header();
    w.reserve_program_headers(1);
    let off = w.reserve(data.len(), PAGE);
    w.write_file_header(&FileHeader {
        os_abi: 0,
        abi_version: 0,
        e_type: elf::ET_CORE,
        e_machine: elf::EM_X86_64,
        e_entry: 0,
        e_flags: 0,
    })
    .unwrap();
    w.write_align_program_headers();
    w.write_program_header(&ProgramHeader {
        p_type: elf::PT_LOAD,
        p_flags: elf::PF_R | elf::PF_W,
        p_offset: off as u64,
        p_vaddr: 0x10000,
        p_paddr: 0,
        p_filesz: data.len() as u64,
        p_memsz: data.len() as u64,
        p_align: PAGE as u64,
    });
    w.write_align(PAGE);
    w.write(data);
    buf
}
