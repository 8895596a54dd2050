//! The encoder-side dictionary of LZ78 and LZW: a map from (phrase code,
//! next byte) to the code of the extended phrase, which is how both walk
//! their phrase trie one byte at a time.
//!
//! It is a plain open-addressing hash table (linear probing) sized once for
//! the most entries the encoder can add before its dictionary resets, so it
//! never grows; `clear` empties it for the reset. Codes are below 2^16, so a
//! key `code << 8 | byte` fits in 24 bits and `u32::MAX` can mark empty slots.

const EMPTY: u32 = u32::MAX;

pub(crate) struct PairTable {
    keys: Vec<u32>,
    vals: Vec<u32>,
    shift: u32,
}

impl PairTable {
    /// A table for up to `entries` entries (kept at most half full).
    pub(crate) fn with_entries(entries: usize) -> Self {
        let size = (entries.max(8) * 2).next_power_of_two();
        PairTable {
            keys: vec![EMPTY; size],
            vals: vec![0; size],
            shift: 32 - size.trailing_zeros(),
        }
    }

    #[inline]
    fn slot(&self, key: u32) -> usize {
        (key.wrapping_mul(0x9E37_79B1) >> self.shift) as usize
    }

    /// The code of phrase `code` extended by `byte`, if it is in the table.
    #[inline]
    pub(crate) fn get(&self, code: u32, byte: u8) -> Option<u32> {
        let key = code << 8 | u32::from(byte);
        let mask = self.keys.len() - 1;
        let mut i = self.slot(key);
        loop {
            match self.keys[i] {
                EMPTY => return None,
                k if k == key => return Some(self.vals[i]),
                _ => i = (i + 1) & mask,
            }
        }
    }

    /// Add phrase `code` + `byte` as `value` (the pair must be absent).
    #[inline]
    pub(crate) fn insert(&mut self, code: u32, byte: u8, value: u32) {
        let key = code << 8 | u32::from(byte);
        let mask = self.keys.len() - 1;
        let mut i = self.slot(key);
        while self.keys[i] != EMPTY {
            i = (i + 1) & mask;
        }
        self.keys[i] = key;
        self.vals[i] = value;
    }

    pub(crate) fn clear(&mut self) {
        self.keys.fill(EMPTY);
    }
}
