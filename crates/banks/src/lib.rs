//! pagefold-banks: which DRAM bank a physical page lives in, and what keeping
//! two programs in different banks does to the row buffers.
//!
//! A DRAM bank holds one open row at a time; an access to another row of the
//! same bank (a row-buffer conflict) closes it and costs a precharge and an
//! activation. Memory controllers spread addresses over banks with XOR
//! functions of physical address bits, so a program that streams through its
//! pages and another that reads at random keep closing each other's rows
//! whenever their pages share banks. Page colouring gives each program pages
//! of its own banks: a page's colour is the value of the bank functions whose
//! bits all lie above the page offset.
//!
//! This crate owns the parts that do not depend on the engine:
//! - [`map`]: a bank map (XOR masks over physical address bits), the table of
//!   published maps for known CPUs, and the bank(s) a page covers;
//! - [`set`]: bank sets as users write them (`0-7,12`);
//! - [`pfn`]: physical frame numbers of this process's pages (pagemap, root);
//! - [`machine`]: whether addresses are real or a virtual machine's guest ones;
//! - [`probe`]: the row-conflict timing probe (the DRAMA method) and the
//!   solver that recovers bank functions from conflicting address pairs;
//! - [`colour`]: the keep-or-retry loop that serves only pages of a set,
//!   generic over where pages come from, so the engine and tests share it;
//! - [`model`]: a trace-driven row-buffer model (banks x open row) that shows
//!   the mechanism where the machine cannot;
//! - [`mem`]: populated anonymous memory for the probe, the loop and the benchmark.

pub mod colour;
pub mod machine;
pub mod map;
pub mod mem;
pub mod model;
pub mod pfn;
pub mod probe;
pub mod set;

pub use map::BankMap;
pub use set::BankSet;

/// Bytes per page the colour is decided for.
pub const PAGE: u64 = 4096;
/// Address bits inside a page: functions using them cannot be chosen by page.
pub const PAGE_SHIFT: u32 = 12;
