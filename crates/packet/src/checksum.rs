//! Internet checksum (RFC 1071), pseudo headers, and incremental update (RFC 1624, eqn. 3).
//!
//! Sums are kept unfolded in a `u64` so that pieces (pseudo header, header, payload) can be added
//! before one final fold. Pieces must start at even offsets of the checksummed message.

/// Adds the big-endian 16-bit words of `data` to `acc`. An odd trailing byte is padded with zero.
#[inline]
pub fn accumulate(mut acc: u64, data: &[u8]) -> u64 {
    let mut words = data.chunks_exact(4);
    for w in &mut words {
        acc += u32::from_be_bytes([w[0], w[1], w[2], w[3]]) as u64;
    }
    let r = words.remainder();
    match r.len() {
        1 => acc += (r[0] as u64) << 8,
        2 => acc += u16::from_be_bytes([r[0], r[1]]) as u64,
        3 => acc += u16::from_be_bytes([r[0], r[1]]) as u64 + ((r[2] as u64) << 8),
        _ => {}
    }
    acc
}

/// Folds an accumulated sum into 16 bits (ones' complement addition of the carries).
#[inline(always)]
pub fn fold(acc: u64) -> u16 {
    // Two end-around-carry additions (add, adc): 64 -> 32 -> 16 bits. Adding the carry back
    // cannot overflow: a sum that carried is at most 2^32 - 2 (2^16 - 2).
    let (s, c) = (acc as u32).overflowing_add((acc >> 32) as u32);
    let s = s + c as u32;
    let (r, c) = (s as u16).overflowing_add((s >> 16) as u16);
    r + c as u16
}

/// The checksum field value for an accumulated sum.
#[inline]
pub fn finish(acc: u64) -> u16 {
    !fold(acc)
}

/// Checksum of a whole buffer (e.g. an IPv4 header with its checksum field zeroed).
pub fn checksum(data: &[u8]) -> u16 {
    finish(accumulate(0, data))
}

/// Pseudo-header sum for TCP/UDP/ICMPv6 over IPv4.
#[inline]
pub fn pseudo_v4(src: [u8; 4], dst: [u8; 4], proto: u8, len: u16) -> u64 {
    u32::from_be_bytes(src) as u64 + u32::from_be_bytes(dst) as u64 + proto as u64 + len as u64
}

/// Pseudo-header sum for TCP/UDP/ICMPv6 over IPv6 (RFC 8200 §8.1).
#[inline]
pub fn pseudo_v6(src: &[u8; 16], dst: &[u8; 16], proto: u8, len: u32) -> u64 {
    let acc = accumulate(0, src);
    let acc = accumulate(acc, dst);
    acc + (len >> 16) as u64 + (len & 0xffff) as u64 + proto as u64
}

/// Incremental update: the checksum `csum` covered `old`; return it covering `new` instead.
/// `old` and `new` have the same even length and sit at the same even offset.
#[inline]
pub fn adjust(csum: u16, old: &[u8], new: &[u8]) -> u16 {
    debug_assert_eq!(old.len(), new.len());
    let mut acc = (!csum) as u64;
    let mut o = old.chunks_exact(2);
    for w in &mut o {
        acc += (!u16::from_be_bytes([w[0], w[1]])) as u64;
    }
    acc = accumulate(acc, new);
    !fold(acc)
}

/// Incremental update for one 16-bit word.
#[inline]
pub fn adjust16(csum: u16, old: u16, new: u16) -> u16 {
    let acc = (!csum) as u64 + (!old) as u64 + new as u64;
    !fold(acc)
}

/// Incremental update for one 32-bit word (two 16-bit words).
#[inline]
pub fn adjust32(csum: u16, old: u32, new: u32) -> u16 {
    let acc = (!csum) as u64 + (!(old >> 16) as u16) as u64 + (!(old as u16)) as u64 + (new >> 16) as u64 + (new & 0xffff) as u64;
    !fold(acc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn rfc1071_example() {
        // The example of RFC 1071 §3: sum of 0001 f203 f4f5 f6f7 = ddf2 (folded).
        let data = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(fold(accumulate(0, &data)), 0xddf2);
        assert_eq!(checksum(&data), !0xddf2);
    }

    #[test]
    fn odd_length_pads_with_zero() {
        assert_eq!(fold(accumulate(0, &[0x12, 0x34, 0x56])), 0x1234 + 0x5600);
    }

    proptest! {
        #[test]
        fn incremental_matches_full(mut data in proptest::collection::vec(any::<u8>(), 2..64usize),
                                    at in 0usize..31, new in any::<[u8; 4]>()) {
            if data.len() % 2 == 1 { data.pop(); }
            let at = (at * 2) % data.len();
            let end = (at + 4).min(data.len());
            let before = checksum(&data);
            let old = data[at..end].to_vec();
            data[at..end].copy_from_slice(&new[..end - at]);
            let inc = adjust(before, &old, &data[at..end]);
            // Ones' complement has two zeros; both are the same checksum.
            let full = checksum(&data);
            prop_assert!(inc == full || (inc == 0 && full == 0xffff) || (inc == 0xffff && full == 0));
        }

        #[test]
        fn adjust32_matches_adjust(csum in any::<u16>(), old in any::<u32>(), new in any::<u32>()) {
            prop_assert_eq!(adjust32(csum, old, new), adjust(csum, &old.to_be_bytes(), &new.to_be_bytes()));
            prop_assert_eq!(adjust16(csum, old as u16, new as u16),
                adjust(csum, &(old as u16).to_be_bytes(), &(new as u16).to_be_bytes()));
        }
    }
}
