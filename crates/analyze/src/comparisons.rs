//! How much comparing it takes to find the duplicates, three ways:
//!
//! - `ksm`: the kernel KSM's algorithm, replayed over the pages in walk
//!   order: search the stable tree (merged pages) by memcmp order; if not
//!   found, search-and-insert in the unstable tree; a match there turns the
//!   pair into a new stable node (inserted by another walk of the stable
//!   tree). Pages that changed between two snapshots are "volatile": as KSM
//!   does for a page whose checksum changed, they are looked up in the stable
//!   tree only and never enter the unstable tree.
//! - `hash-index`: a hash table of contents (xxh3 of every page); a page is
//!   byte-compared only with pages of equal hash. What pagefold's engine does.
//! - `bmd`: CMDP's behaviour-based memory deduplication: the same KSM trees,
//!   but one pair per behaviour class, so a page is compared only with pages
//!   that behaved alike. Classes come from two snapshots (changed /
//!   unchanged / new, crossed with writable or read-only mapping); with one
//!   snapshot only the mapping permission separates classes.
//!
//! Every memcmp counts as one page comparison and adds the bytes it had to
//! examine (first difference + 1, or 4096 for a match); a comparison that
//! does not end in a merge is futile. "Pages merged" is pages minus the
//! distinct contents after merging, i.e. the pages saved, zero pages
//! included (KSM merges those too by default).
//!
//! The trees are AVL trees in an arena (depth within 1.44 log2 n, like the
//! kernel's red-black trees within 2 log2 n); removal from the unstable tree
//! navigates without counting, as the kernel erases a node by pointer.

use std::cmp::Ordering;
use std::collections::{BTreeMap, HashMap};

use rayon::prelude::*;
use serde::Serialize;

use crate::image::{memcmp_counted, Change, Image};
use crate::progress::{Bar, Progress};
use crate::scan::Scan;

#[derive(Debug, Clone, Default, Serialize)]
pub struct Cost {
    pub pages: u64,
    pub page_compares: u64,
    pub bytes_compared: u64,
    pub futile_compares: u64,
    /// Pages hashed (hash index only).
    pub pages_hashed: u64,
    /// Pages saved by the merges found.
    pub pages_merged: u64,
}

impl Cost {
    fn add(&mut self, o: &Cost) {
        self.pages += o.pages;
        self.page_compares += o.page_compares;
        self.bytes_compared += o.bytes_compared;
        self.futile_compares += o.futile_compares;
        self.pages_hashed += o.pages_hashed;
        self.pages_merged += o.pages_merged;
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Method {
    pub name: &'static str,
    #[serde(flatten)]
    pub cost: Cost,
    /// pages_merged relative to the hash index (which finds all duplicates).
    pub sharing_found_pct: f64,
    /// page_compares relative to KSM.
    pub compares_pct_of_ksm: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct ClassCost {
    pub class: String,
    #[serde(flatten)]
    pub cost: Cost,
}

#[derive(Debug, Clone, Serialize)]
pub struct Comparisons {
    /// "snapshots" or "permissions".
    pub classes_from: &'static str,
    pub volatile_pages: u64,
    pub methods: Vec<Method>,
    pub bmd_classes: Vec<ClassCost>,
    pub seconds: f64,
}

const NIL: u32 = u32::MAX;

struct Node {
    page: u32,
    left: u32,
    right: u32,
    height: i32,
}

/// An AVL tree of pages ordered by content.
struct Tree {
    nodes: Vec<Node>,
    free: Vec<u32>,
    root: u32,
}

struct Counter<'a> {
    image: &'a Image,
    cost: Cost,
}

impl Counter<'_> {
    fn cmp(&mut self, a: u32, b: u32) -> Ordering {
        let (o, n) = memcmp_counted(self.image.page(a as usize), self.image.page(b as usize));
        self.cost.page_compares += 1;
        self.cost.bytes_compared += n as u64;
        if o != Ordering::Equal {
            self.cost.futile_compares += 1;
        }
        o
    }
}

impl Tree {
    fn new() -> Tree {
        Tree {
            nodes: Vec::new(),
            free: Vec::new(),
            root: NIL,
        }
    }

    fn h(&self, n: u32) -> i32 {
        if n == NIL {
            0
        } else {
            self.nodes[n as usize].height
        }
    }

    fn fix(&mut self, n: u32) {
        let (l, r) = (self.nodes[n as usize].left, self.nodes[n as usize].right);
        self.nodes[n as usize].height = 1 + self.h(l).max(self.h(r));
    }

    fn rot_right(&mut self, n: u32) -> u32 {
        let l = self.nodes[n as usize].left;
        self.nodes[n as usize].left = self.nodes[l as usize].right;
        self.nodes[l as usize].right = n;
        self.fix(n);
        self.fix(l);
        l
    }

    fn rot_left(&mut self, n: u32) -> u32 {
        let r = self.nodes[n as usize].right;
        self.nodes[n as usize].right = self.nodes[r as usize].left;
        self.nodes[r as usize].left = n;
        self.fix(n);
        self.fix(r);
        r
    }

    fn balance(&mut self, n: u32) -> u32 {
        self.fix(n);
        let (l, r) = (self.nodes[n as usize].left, self.nodes[n as usize].right);
        let bf = self.h(l) - self.h(r);
        if bf > 1 {
            let (ll, lr) = (self.nodes[l as usize].left, self.nodes[l as usize].right);
            if self.h(ll) < self.h(lr) {
                self.nodes[n as usize].left = self.rot_left(l);
            }
            return self.rot_right(n);
        }
        if bf < -1 {
            let (rl, rr) = (self.nodes[r as usize].left, self.nodes[r as usize].right);
            if self.h(rr) < self.h(rl) {
                self.nodes[n as usize].right = self.rot_right(r);
            }
            return self.rot_left(n);
        }
        n
    }

    fn alloc(&mut self, page: u32) -> u32 {
        let node = Node {
            page,
            left: NIL,
            right: NIL,
            height: 1,
        };
        match self.free.pop() {
            Some(i) => {
                self.nodes[i as usize] = node;
                i
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        }
    }

    /// The page in the tree with the same content, counting comparisons.
    fn search(&self, page: u32, c: &mut Counter) -> Option<u32> {
        let mut n = self.root;
        while n != NIL {
            let node = &self.nodes[n as usize];
            match c.cmp(page, node.page) {
                Ordering::Equal => return Some(node.page),
                Ordering::Less => n = node.left,
                Ordering::Greater => n = node.right,
            }
        }
        None
    }

    /// Inserts `page` unless a page with its content is there (returned).
    fn search_insert(&mut self, page: u32, c: &mut Counter) -> Option<u32> {
        let mut found = None;
        self.root = self.ins(self.root, page, c, &mut found);
        found
    }

    fn ins(&mut self, n: u32, page: u32, c: &mut Counter, found: &mut Option<u32>) -> u32 {
        if n == NIL {
            return self.alloc(page);
        }
        let other = self.nodes[n as usize].page;
        match c.cmp(page, other) {
            Ordering::Equal => {
                *found = Some(other);
                n
            }
            Ordering::Less => {
                let l = self.nodes[n as usize].left;
                let l = self.ins(l, page, c, found);
                self.nodes[n as usize].left = l;
                if found.is_some() {
                    n
                } else {
                    self.balance(n)
                }
            }
            Ordering::Greater => {
                let r = self.nodes[n as usize].right;
                let r = self.ins(r, page, c, found);
                self.nodes[n as usize].right = r;
                if found.is_some() {
                    n
                } else {
                    self.balance(n)
                }
            }
        }
    }

    /// Removes the node holding `page` (navigation is not counted).
    fn remove(&mut self, page: u32, image: &Image) {
        self.root = self.del(self.root, page, image);
    }

    fn del(&mut self, n: u32, page: u32, image: &Image) -> u32 {
        if n == NIL {
            return NIL;
        }
        let other = self.nodes[n as usize].page;
        let o = if other == page {
            Ordering::Equal
        } else {
            image.page(page as usize).cmp(image.page(other as usize))
        };
        match o {
            Ordering::Less => {
                let l = self.del(self.nodes[n as usize].left, page, image);
                self.nodes[n as usize].left = l;
            }
            Ordering::Greater => {
                let r = self.del(self.nodes[n as usize].right, page, image);
                self.nodes[n as usize].right = r;
            }
            Ordering::Equal => {
                let (l, r) = (self.nodes[n as usize].left, self.nodes[n as usize].right);
                if l == NIL || r == NIL {
                    self.free.push(n);
                    return if l == NIL { r } else { l };
                }
                // Replace by the smallest node of the right subtree.
                let mut m = r;
                while self.nodes[m as usize].left != NIL {
                    m = self.nodes[m as usize].left;
                }
                let succ = self.nodes[m as usize].page;
                let r = self.del(r, succ, image);
                self.nodes[n as usize].page = succ;
                self.nodes[n as usize].right = r;
            }
        }
        self.balance(n)
    }
}

/// Replays KSM over `pages` (in order); `volatile[i]` pages skip the
/// unstable tree.
fn ksm(image: &Image, pages: &[u32], volatile: &dyn Fn(u32) -> bool, bar: &Bar) -> Cost {
    let mut c = Counter {
        image,
        cost: Cost::default(),
    };
    let mut stable = Tree::new();
    let mut unstable = Tree::new();
    for (i, &p) in pages.iter().enumerate() {
        if i % 4096 == 4095 {
            bar.inc(4096);
        }
        c.cost.pages += 1;
        if stable.search(p, &mut c).is_some() {
            c.cost.pages_merged += 1;
            continue;
        }
        if volatile(p) {
            continue;
        }
        if let Some(q) = unstable.search_insert(p, &mut c) {
            unstable.remove(q, image);
            // The pair becomes a stable node: one page saved.
            let _ = stable.search_insert(q, &mut c);
            c.cost.pages_merged += 1;
        }
    }
    bar.inc((pages.len() % 4096) as u64);
    c.cost
}

fn hash_index(image: &Image, scan: &Scan, bar: &Bar) -> Cost {
    let mut c = Counter {
        image,
        cost: Cost::default(),
    };
    let mut table: HashMap<u64, Vec<u32>> = HashMap::new();
    for p in 0..image.pages() as u32 {
        if p % 4096 == 4095 {
            bar.inc(4096);
        }
        c.cost.pages += 1;
        c.cost.pages_hashed += 1;
        let bucket = table.entry(scan.hash[p as usize]).or_default();
        let mut merged = false;
        for &q in bucket.iter() {
            if c.cmp(p, q) == Ordering::Equal {
                merged = true;
                break;
            }
        }
        if merged {
            c.cost.pages_merged += 1;
        } else {
            bucket.push(p);
        }
    }
    bar.inc((image.pages() % 4096) as u64);
    c.cost
}

/// Behaviour class label of a page.
fn class_of(image: &Image, p: usize) -> String {
    let w = if image.region(p).perms.write {
        "writable"
    } else {
        "read-only"
    };
    match &image.changes {
        Some(ch) => format!("{} {w}", ch[p].name()),
        None => w.to_string(),
    }
}

pub fn compare(image: &Image, scan: &Scan, progress: &Progress) -> Comparisons {
    let start = std::time::Instant::now();
    let n = image.pages();
    let bar = progress.stage("compare", 3 * n as u64, false);
    let volatile = |p: u32| {
        matches!(
            image.changes.as_ref().map(|c| c[p as usize]),
            Some(Change::Changed)
        )
    };
    let volatile_pages = (0..n as u32).filter(|&p| volatile(p)).count() as u64;
    let all: Vec<u32> = (0..n as u32).collect();
    let mut classes: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for p in 0..n {
        classes
            .entry(class_of(image, p))
            .or_default()
            .push(p as u32);
    }
    let classes: Vec<(String, Vec<u32>)> = classes.into_iter().collect();
    let ((ksm_cost, hash_cost), bmd) = rayon::join(
        || {
            rayon::join(
                || ksm(image, &all, &volatile, &bar),
                || hash_index(image, scan, &bar),
            )
        },
        || {
            classes
                .par_iter()
                .map(|(name, pages)| ClassCost {
                    class: name.clone(),
                    cost: ksm(image, pages, &volatile, &bar),
                })
                .collect::<Vec<_>>()
        },
    );
    bar.finish();
    let mut bmd_total = Cost::default();
    for c in &bmd {
        bmd_total.add(&c.cost);
    }
    let found = |c: &Cost| {
        if hash_cost.pages_merged == 0 {
            100.0
        } else {
            100.0 * c.pages_merged as f64 / hash_cost.pages_merged as f64
        }
    };
    let of_ksm = |c: &Cost| {
        if ksm_cost.page_compares == 0 {
            0.0
        } else {
            100.0 * c.page_compares as f64 / ksm_cost.page_compares as f64
        }
    };
    let methods = vec![
        Method {
            name: "ksm",
            sharing_found_pct: found(&ksm_cost),
            compares_pct_of_ksm: of_ksm(&ksm_cost),
            cost: ksm_cost.clone(),
        },
        Method {
            name: "hash-index",
            sharing_found_pct: found(&hash_cost),
            compares_pct_of_ksm: of_ksm(&hash_cost),
            cost: hash_cost.clone(),
        },
        Method {
            name: "bmd",
            sharing_found_pct: found(&bmd_total),
            compares_pct_of_ksm: of_ksm(&bmd_total),
            cost: bmd_total,
        },
    ];
    Comparisons {
        classes_from: if image.changes.is_some() {
            "snapshots"
        } else {
            "permissions"
        },
        volatile_pages,
        methods,
        bmd_classes: bmd,
        seconds: start.elapsed().as_secs_f64(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::PAGE;

    fn image_of(contents: &[u8]) -> Image {
        let mut data = Vec::new();
        for &c in contents {
            data.extend(std::iter::repeat_n(c, PAGE));
        }
        Image::in_memory(data)
    }

    #[test]
    fn ksm_finds_all_duplicates_and_tree_stays_ordered() {
        // 200 pages, 50 distinct contents, each 4 times, interleaved.
        let contents: Vec<u8> = (0..200).map(|i| (i % 50) as u8 + 1).collect();
        let img = image_of(&contents);
        let pages: Vec<u32> = (0..200).collect();
        let c = ksm(
            &img,
            &pages,
            &|_| false,
            &Progress::hidden().stage("t", 1, false),
        );
        assert_eq!(c.pages_merged, 150);
        // Every merge needs at least one matching compare.
        assert!(c.page_compares - c.futile_compares >= 150);
    }

    #[test]
    fn avl_remove_keeps_search_working() {
        let contents: Vec<u8> = (1..=100).collect();
        let img = image_of(&contents);
        let mut c = Counter {
            image: &img,
            cost: Cost::default(),
        };
        let mut t = Tree::new();
        for p in 0..100 {
            assert!(t.search_insert(p, &mut c).is_none());
        }
        assert!(t.h(t.root) <= 8);
        for p in (0..100).step_by(2) {
            t.remove(p, &img);
        }
        for p in 0..100u32 {
            assert_eq!(t.search(p, &mut c).is_some(), p % 2 == 1, "page {p}");
        }
    }
}
