//! The Internet checksum (RFC 1071) over small fixed buffers.

/// Adds the 16-bit big-endian words of `bytes` (even length) to `sum`.
#[inline(always)]
pub fn sum_words<const N: usize>(bytes: &[u8; N], mut sum: u32) -> u32 {
    let mut index = 0;
    while index + 1 < N {
        sum += u32::from(u16::from_be_bytes([bytes[index], bytes[index + 1]]));
        index += 2;
    }
    sum
}

/// Folds the carries and complements: the value to store in a checksum field.
#[inline(always)]
pub fn fold(mut sum: u32) -> u16 {
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    !(sum as u16)
}
