//! A bank map: the XOR functions that give a physical address its DRAM bank.
//!
//! Function `i` is a mask over physical address bits; its value for an
//! address is the parity of the masked bits, and bank index bit `i` is that
//! value. A map with `n` functions names `2^n` banks (channel, rank and bank
//! group functions count as bank bits here: all of them separate row buffers).
//!
//! A page covers every bank its lines fall in. Functions made only of bits at
//! or above the page offset have one value per page; a function that also
//! uses a bit below it (lines of the same page differ there) takes both
//! values inside every page, so the page covers two banks for it, and no
//! page colouring can separate those two. [`BankMap::page_banks`] returns the
//! whole set a page covers; a bank set is reachable by pages only if it is
//! closed under those in-page functions ([`BankMap::reachable`]).
//!
//! The table holds maps published for known CPUs. On a machine whose map was
//! not measured, the entry chosen is an assumption, and says so.

use serde::Serialize;

use crate::set::BankSet;
use crate::PAGE_SHIFT;

/// Where a map came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// Recovered on this machine by the timing probe.
    Measured,
    /// Taken from the table of published maps; not checked on this machine.
    Table,
    /// Masks given by the user (`PAGEFOLD_BANK_FUNCTIONS`).
    Given,
}

/// XOR bank functions over physical address bits.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BankMap {
    /// A short name (the table entry, or "measured").
    pub name: String,
    pub source: Source,
    /// One mask per bank index bit, lowest first.
    pub functions: Vec<u64>,
}

/// One published map.
pub struct KnownMap {
    pub name: &'static str,
    /// What it was published for and by whom.
    pub origin: &'static str,
    pub functions: &'static [u64],
}

/// Published bank functions. Masks of physical address bits.
pub const KNOWN: &[KnownMap] = &[
    KnownMap {
        name: "coffee-lake-ddr4-1rank",
        origin: "Intel Coffee Lake / Comet Lake, DDR4, one channel, one rank, 16 banks \
                 (bank functions as published with the Blacksmith Rowhammer fuzzer)",
        functions: &[0x2040, 0x24000, 0x48000, 0x90000],
    },
    KnownMap {
        name: "coffee-lake-ddr4-2rank",
        origin: "Intel Coffee Lake / Comet Lake, DDR4, one channel, two ranks, 32 banks \
                 (bank and rank functions as published with the Blacksmith Rowhammer fuzzer)",
        functions: &[0x2040, 0x44000, 0x88000, 0x110000, 0x220000],
    },
    KnownMap {
        name: "sandy-bridge-ddr3-1ch",
        origin: "Intel Sandy Bridge, DDR3, one channel, 8 banks: bank address bits 13-15 \
                 XORed with the lowest row bits 17-19 (as reverse engineered for Rowhammer)",
        functions: &[0x22000, 0x44000, 0x88000],
    },
];

impl BankMap {
    /// A map of the given functions (at most 6: 64 banks, the size of a [`BankSet`]).
    pub fn new(name: &str, source: Source, functions: Vec<u64>) -> BankMap {
        assert!(
            !functions.is_empty() && functions.len() <= 6,
            "1 to 6 bank functions"
        );
        BankMap {
            name: name.to_string(),
            source,
            functions,
        }
    }

    /// The table entry of that name.
    pub fn known(name: &str) -> Option<BankMap> {
        KNOWN
            .iter()
            .find(|k| k.name == name)
            .map(|k| BankMap::new(k.name, Source::Table, k.functions.to_vec()))
    }

    /// Number of banks the functions name.
    pub fn bank_count(&self) -> u32 {
        1 << self.functions.len()
    }

    /// The bank of physical address `pa`.
    pub fn bank_of(&self, pa: u64) -> u32 {
        self.functions
            .iter()
            .enumerate()
            .map(|(i, &f)| ((pa & f).count_ones() & 1) << i)
            .fold(0, |bank, bit| bank | bit)
    }

    /// Address bits below the page offset that some function uses.
    pub fn in_page_bits(&self) -> u64 {
        let page_mask = (1u64 << PAGE_SHIFT) - 1;
        self.functions
            .iter()
            .fold(0, |acc, f| acc | (f & page_mask))
    }

    /// The banks the lines of page `pfn` fall in.
    pub fn page_banks(&self, pfn: u64) -> BankSet {
        let base = pfn << PAGE_SHIFT;
        let low = self.in_page_bits();
        let mut set = BankSet::empty();
        // Every combination of the in-page bits the functions look at.
        let mut sub = 0u64;
        loop {
            set.insert(self.bank_of(base | sub));
            sub = sub.wrapping_sub(low) & low;
            if sub == 0 {
                break;
            }
        }
        set
    }

    /// Whether page `pfn` lies wholly in `set`.
    pub fn page_fits(&self, pfn: u64, set: &BankSet) -> bool {
        self.page_banks(pfn).is_subset(set)
    }

    /// Whether some page can lie wholly in `set`: the set must hold, with
    /// each of its banks, the banks the same page always covers with it.
    pub fn reachable(&self, set: &BankSet) -> bool {
        let always = self.page_banks(0);
        let partner_masks: Vec<u32> = always.iter().map(|b| b ^ self.bank_of(0)).collect();
        set.iter()
            .any(|b| partner_masks.iter().all(|m| set.contains(b ^ m)))
    }

    /// The functions as lists of bit numbers, e.g. `(6, 13)`.
    pub fn describe(&self) -> Vec<String> {
        self.functions.iter().map(|&f| bits_of(f)).collect()
    }
}

/// `(6, 13)` for mask 0x2040.
pub fn bits_of(mask: u64) -> String {
    let bits: Vec<String> = (0..64)
        .filter(|b| mask >> b & 1 == 1)
        .map(|b| b.to_string())
        .collect();
    format!("({})", bits.join(", "))
}

/// The table entry assumed for this CPU, and why it was chosen.
pub fn assumed_for_this_cpu() -> (BankMap, String) {
    let (family, model) = crate::machine::cpu_family_model();
    let name = "coffee-lake-ddr4-1rank";
    let why = match (family, model) {
        (6, 0x9e | 0xa5 | 0xa6 | 0x8e) => {
            format!("family {family} model {model:#x} is a Coffee Lake / Comet Lake client part")
        }
        (6, 0xa7) => format!(
            "family {family} model {model:#x} (Rocket Lake) has no published entry; the closest \
             client predecessor's single-channel single-rank map is assumed"
        ),
        (6, 0x2a | 0x2d) => {
            return (
                BankMap::known("sandy-bridge-ddr3-1ch").expect("table entry"),
                format!("family {family} model {model:#x} is Sandy Bridge"),
            )
        }
        _ => format!(
            "family {family} model {model:#x} has no entry; the single-channel single-rank DDR4 \
             map is assumed"
        ),
    };
    (BankMap::known(name).expect("table entry"), why)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn coffee() -> BankMap {
        BankMap::known("coffee-lake-ddr4-1rank").unwrap()
    }

    #[test]
    fn bank_of_known_addresses() {
        let m = coffee();
        assert_eq!(m.bank_count(), 16);
        assert_eq!(m.bank_of(0), 0);
        // Bit 6 alone: function 0 (6, 13) only.
        assert_eq!(m.bank_of(1 << 6), 0b0001);
        // Bits 6 and 13 cancel.
        assert_eq!(m.bank_of((1 << 6) | (1 << 13)), 0);
        // Bit 14 feeds function 1, bit 18 function 2, bit 19 function 3.
        assert_eq!(m.bank_of(1 << 14), 0b0010);
        assert_eq!(m.bank_of(1 << 18), 0b0100);
        assert_eq!(m.bank_of(1 << 19), 0b1000);
        // Bits 14 and 17 cancel in function 1.
        assert_eq!(m.bank_of((1 << 14) | (1 << 17)), 0);
    }

    #[test]
    fn a_page_covers_the_two_banks_of_its_in_page_function() {
        let m = coffee();
        assert_eq!(m.in_page_bits(), 1 << 6);
        let banks: Vec<u32> = m.page_banks(0).iter().collect();
        assert_eq!(banks, vec![0, 1]);
        // PFN 2 sets address bit 13: same pair.
        assert_eq!(m.page_banks(2).iter().collect::<Vec<_>>(), vec![0, 1]);
        // PFN 4 sets bit 14: banks 2 and 3.
        assert_eq!(m.page_banks(4).iter().collect::<Vec<_>>(), vec![2, 3]);
    }

    #[test]
    fn reachable_sets_hold_both_banks_of_each_pair() {
        let m = coffee();
        assert!(m.reachable(&BankSet::parse("0-7", 16).unwrap()));
        assert!(m.reachable(&BankSet::parse("2,3", 16).unwrap()));
        assert!(!m.reachable(&BankSet::parse("0,2,4,6", 16).unwrap()));
        let sandy = BankMap::known("sandy-bridge-ddr3-1ch").unwrap();
        assert!(sandy.reachable(&BankSet::parse("5", 8).unwrap()));
    }

    #[test]
    fn describe_lists_bits() {
        assert_eq!(coffee().describe()[0], "(6, 13)");
        assert_eq!(bits_of(0x90000), "(16, 19)");
    }
}
