//! Which pages of a target the readers keep: a [`Filter`] of mapping kinds
//! (anon/file/heap/stack) and address ranges, applied by each reader (`core`,
//! `live`, `raw`) as it walks a target's mappings. It lives apart from the
//! readers' dispatch in `read` so that the readers depend on it without
//! depending on the module that calls them.

use crate::image::Kind;

/// Which pages of a target to keep.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// Mapping kinds to keep; `None` keeps all.
    pub kinds: Option<Vec<Kind>>,
    /// Address ranges [start, end) to keep (virtual addresses, or file
    /// offsets for raw images); empty keeps all.
    pub ranges: Vec<(u64, u64)>,
}

impl Filter {
    pub fn accepts_kind(&self, kind: Kind) -> bool {
        match (&self.kinds, kind) {
            (_, Kind::Image) => true,
            (None, _) => true,
            (Some(k), kind) => k.contains(&kind),
        }
    }

    /// The parts of [a, b) inside the range filter, page-aligned inward.
    pub fn clip(&self, a: u64, b: u64) -> Vec<(u64, u64)> {
        let page = crate::image::PAGE as u64;
        if self.ranges.is_empty() {
            return if b > a { vec![(a, b)] } else { vec![] };
        }
        let mut out = Vec::new();
        for &(ra, rb) in &self.ranges {
            let s = a.max(ra);
            let e = b.min(rb);
            let s = s.next_multiple_of(page).max(a);
            let e = a + (e.saturating_sub(a) / page) * page;
            if e > s {
                out.push((s, e));
            }
        }
        out.sort_unstable();
        out.dedup();
        out
    }
}
