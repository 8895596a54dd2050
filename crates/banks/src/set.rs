//! Bank sets as users write them: `0-7,12` (ranges and single banks,
//! comma-separated), checked against the number of banks the map names.
//!
//! A set is a 64-bit mask: bank maps here name at most 64 banks. Errors are
//! one line each, fit to print after the option that carried the set.

use std::fmt;

/// A set of bank indices below 64.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct BankSet(pub u64);

/// Why a bank set did not parse.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SetError {
    Empty,
    NotANumber(String),
    Reversed { from: u32, to: u32 },
    BeyondCount { bank: u32, count: u32 },
}

impl fmt::Display for SetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SetError::Empty => write!(f, "empty bank set (write e.g. 0-7 or 0-3,8)"),
            SetError::NotANumber(s) => write!(f, "'{s}' is not a bank number or range"),
            SetError::Reversed { from, to } => {
                write!(f, "range {from}-{to} runs backwards (write {to}-{from})")
            }
            SetError::BeyondCount { bank, count } => write!(
                f,
                "bank {bank} does not exist: this bank map has banks 0-{}",
                count - 1
            ),
        }
    }
}

impl std::error::Error for SetError {}

impl BankSet {
    pub fn empty() -> BankSet {
        BankSet(0)
    }

    /// Every bank of a map with `count` banks.
    pub fn all(count: u32) -> BankSet {
        BankSet(if count >= 64 {
            u64::MAX
        } else {
            (1 << count) - 1
        })
    }

    /// Parses `0-7,12` for a map of `count` banks (at most 64).
    pub fn parse(text: &str, count: u32) -> Result<BankSet, SetError> {
        let mut set = BankSet::empty();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (from, to) = match part.split_once('-') {
                Some((a, b)) => (number(a)?, number(b)?),
                None => {
                    let n = number(part)?;
                    (n, n)
                }
            };
            if from > to {
                return Err(SetError::Reversed { from, to });
            }
            if to >= count.min(64) {
                return Err(SetError::BeyondCount { bank: to, count });
            }
            (from..=to).for_each(|b| set.insert(b));
        }
        if set.is_empty() {
            return Err(SetError::Empty);
        }
        Ok(set)
    }

    pub fn insert(&mut self, bank: u32) {
        self.0 |= 1 << bank;
    }

    pub fn contains(&self, bank: u32) -> bool {
        bank < 64 && self.0 >> bank & 1 == 1
    }

    pub fn is_empty(&self) -> bool {
        self.0 == 0
    }

    pub fn len(&self) -> u32 {
        self.0.count_ones()
    }

    pub fn is_subset(&self, other: &BankSet) -> bool {
        self.0 & !other.0 == 0
    }

    /// The banks of a map of `count` banks not in this set.
    pub fn complement(&self, count: u32) -> BankSet {
        BankSet(BankSet::all(count).0 & !self.0)
    }

    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        (0..64).filter(|&b| self.contains(b))
    }
}

fn number(s: &str) -> Result<u32, SetError> {
    s.trim()
        .parse::<u32>()
        .map_err(|_| SetError::NotANumber(s.trim().to_string()))
}

impl fmt::Display for BankSet {
    /// Ranges, as parsed: `0-7,12`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let banks: Vec<u32> = self.iter().collect();
        let mut parts = Vec::new();
        let mut i = 0;
        while i < banks.len() {
            let mut j = i;
            while j + 1 < banks.len() && banks[j + 1] == banks[j] + 1 {
                j += 1;
            }
            parts.push(if i == j {
                banks[i].to_string()
            } else {
                format!("{}-{}", banks[i], banks[j])
            });
            i = j + 1;
        }
        write!(f, "{}", parts.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ranges_and_singles() {
        let s = BankSet::parse("0-3, 8,10-11", 16).unwrap();
        assert_eq!(s.iter().collect::<Vec<_>>(), vec![0, 1, 2, 3, 8, 10, 11]);
        assert_eq!(s.to_string(), "0-3,8,10-11");
        assert_eq!(BankSet::parse("5", 8).unwrap().0, 1 << 5);
        assert_eq!(BankSet::parse("0-63", 64).unwrap(), BankSet::all(64));
    }

    #[test]
    fn rejects_bad_sets_with_a_reason() {
        assert_eq!(
            BankSet::parse("9-3", 16),
            Err(SetError::Reversed { from: 9, to: 3 })
        );
        assert_eq!(
            BankSet::parse("0-16", 16),
            Err(SetError::BeyondCount {
                bank: 16,
                count: 16
            })
        );
        assert_eq!(BankSet::parse("", 16), Err(SetError::Empty));
        assert_eq!(BankSet::parse(" , ", 16), Err(SetError::Empty));
        assert!(matches!(
            BankSet::parse("a-3", 16),
            Err(SetError::NotANumber(_))
        ));
        assert!(matches!(
            BankSet::parse("-1", 16),
            Err(SetError::NotANumber(_))
        ));
        let msg = BankSet::parse("9-3", 16).unwrap_err().to_string();
        assert!(!msg.contains('\n'), "one line: {msg}");
    }

    #[test]
    fn complement_and_subset() {
        let low = BankSet::parse("0-7", 16).unwrap();
        let high = low.complement(16);
        assert_eq!(high.to_string(), "8-15");
        assert!(BankSet::parse("2-3", 16).unwrap().is_subset(&low));
        assert!(!high.is_subset(&low));
    }
}
