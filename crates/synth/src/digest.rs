//! Checksums over whole buffers. They are how a workload proves it read its
//! data (a footprint bought by never looking is no saving) and what
//! `pagefold bench` compares byte for byte against the plain run. Four
//! independent lanes keep the multiply chain off the critical path, so a
//! digest runs at memory speed.

const LANE_SEEDS: [u64; 4] = [
    0x243f_6a88_85a3_08d3,
    0x1319_8a2e_0370_7344,
    0xa409_3822_299f_31d0,
    0x082e_fa98_ec4e_6c89,
];
const MUL: u64 = 0x9e37_79b9_7f4a_7c15;

/// A 64-bit digest of `words`, different for different `seed`s.
pub fn digest(words: &[u64], seed: u64) -> u64 {
    let mut lanes = LANE_SEEDS.map(|s| s ^ seed);
    let mut chunks = words.chunks_exact(4);
    for c in &mut chunks {
        for (lane, w) in lanes.iter_mut().zip(c) {
            *lane = (*lane ^ w).wrapping_mul(MUL).rotate_left(29);
        }
    }
    for (lane, w) in lanes.iter_mut().zip(chunks.remainder()) {
        *lane = (*lane ^ w).wrapping_mul(MUL).rotate_left(29);
    }
    lanes.iter().fold(words.len() as u64, |h, l| mix(h ^ l))
}

/// MurmurHash3's 64-bit finalizer: every input bit reaches every output bit.
pub fn mix(h: u64) -> u64 {
    let h = (h ^ (h >> 33)).wrapping_mul(0xff51_afd7_ed55_8ccd);
    let h = (h ^ (h >> 33)).wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// Digest of a sequence of digests, in order.
pub fn chain(h: u64, value: u64) -> u64 {
    mix(h.rotate_left(17) ^ value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_word_and_position_counts() {
        let a: Vec<u64> = (0..37).collect();
        let mut b = a.clone();
        b[36] ^= 1;
        let mut c = a.clone();
        c.swap(0, 1);
        assert_ne!(digest(&a, 0), digest(&b, 0), "the remainder is read");
        assert_ne!(digest(&a, 0), digest(&c, 0), "order matters");
        assert_ne!(digest(&a, 0), digest(&a, 1), "the seed matters");
        assert_ne!(digest(&[0; 8], 0), digest(&[0; 16], 0), "length matters");
        assert_eq!(digest(&a, 5), digest(&a.clone(), 5));
    }
}
