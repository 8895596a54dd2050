//! The layout of a page's `seen` word (`Block::seen`, space.rs): what the
//! scans and the clock remember about each page between their looks, kept
//! in one `u32` per page so that splitting, trimming and resetting a block
//! keeps or resets all of it together. This module alone knows which bit
//! means what; idle.rs (the smart scan's level) and clock.rs (the tiering
//! clock) read and change the word through it.
//!
//! - bits 0-21: the previous look (1: zero; else a sampled hash with bit 1
//!   set; 0: never looked at), idle.rs;
//! - bit 22: offered for a patch, the page found no reference;
//! - bit 23: refused by the page store as incompressible;
//! - bits 24-26: the idle level (looks in a row that found nothing to do), idle.rs;
//! - bit 27: written since the last clock pass;
//! - bit 28: restored (touched after eviction) since the last clock pass;
//! - bits 29-31: clock passes without access, capped at `MAX_AGE`.

/// The bits holding what the previous look saw.
pub const LOOK_MASK: u32 = 0x003f_ffff;
/// Offered for a patch, the page found no reference: not offered for one
/// again until written (a later similar page finds it instead).
pub const NO_REFERENCE: u32 = 1 << 22;
pub const REFUSED: u32 = 1 << 23;
pub const LEVEL_SHIFT: u32 = 24;
pub const LEVEL_MASK: u32 = 0x0700_0000;
pub const WRITTEN: u32 = 1 << 27;
pub const ACCESSED: u32 = 1 << 28;
pub const AGE_SHIFT: u32 = 29;
/// Most passes without access a page's age counts; `cold_passes` is capped to it.
pub const MAX_AGE: u32 = 7;

/// The idle level.
pub fn level(seen: u32) -> u32 {
    (seen & LEVEL_MASK) >> LEVEL_SHIFT
}

/// `seen` with idle level `level`.
pub fn with_level(seen: u32, level: u32) -> u32 {
    (seen & !LEVEL_MASK) | (level << LEVEL_SHIFT)
}

/// `seen` with a new look recorded, its level kept.
pub fn with_look(seen: u32, look: u32) -> u32 {
    (seen & !LOOK_MASK) | (look & LOOK_MASK)
}

/// Whether the look this `seen` records folded the page as zero: it saw
/// zero and acted (a look that acts resets the idle level).
pub fn folded_zero(seen: u32) -> bool {
    seen & LOOK_MASK == 1 && level(seen) == 0
}

/// Passes without access.
pub fn age(seen: u32) -> u32 {
    seen >> AGE_SHIFT
}

/// `seen` of a page a scan saw written (new content: it may compress now).
pub fn written(seen: u32) -> u32 {
    (seen | WRITTEN) & !(REFUSED | NO_REFERENCE)
}

/// `seen` of a page for which patching found no reference.
pub fn no_reference(seen: u32) -> u32 {
    seen | NO_REFERENCE
}

/// `seen` of a page the store refused as incompressible.
pub fn refused(seen: u32) -> u32 {
    seen | REFUSED
}

/// Whether a pass must look at the page whatever the smart scan says: all
/// but those refused as incompressible, which the policy leaves alone until
/// a look sees them written (the smart scan's looks still come).
pub fn wanted(seen: u32) -> bool {
    seen & REFUSED == 0
}

/// `seen` of a page restored because something touched it.
pub fn accessed(seen: u32) -> u32 {
    seen | ACCESSED
}

/// `seen` of a page just evicted: the look stays (a restored page that was
/// only read then looks unchanged, C2); idle level and clock start again.
pub fn on_evict(seen: u32) -> u32 {
    seen & LOOK_MASK
}
