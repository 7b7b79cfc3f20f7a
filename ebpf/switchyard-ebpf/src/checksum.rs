//! The Internet checksum (RFC 1071) over small fixed buffers, and its
//! incremental update (RFC 1624).

use aya_ebpf::helpers::bpf_csum_diff;

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

/// The checksum (two bytes as stored) after the 16-bit words `old` it covers
/// became `new` (RFC 1624: `HC' = ~(~HC + ~m + m')`). For a word or two; longer
/// changes go through [`difference`].
#[inline(always)]
pub fn adjust(checksum: [u8; 2], old: &[u8; 2], new: &[u8; 2]) -> [u8; 2] {
    let sum = u32::from(!u16::from_ne_bytes(checksum))
        + u32::from(!u16::from_ne_bytes(*old))
        + u32::from(u16::from_ne_bytes(*new));
    fold(sum).to_ne_bytes()
}

/// The one's complement sum of the change from `old` to `new` over `length`
/// bytes (a multiple of 4) from `offset`, as `bpf_csum_diff` computes it (in
/// memory order): the argument of [`with_difference`].
#[inline(always)]
pub fn difference<const N: usize>(
    old: &[u8; N],
    new: &[u8; N],
    offset: usize,
    length: u32,
) -> Result<u32, ()> {
    if offset + length as usize > N {
        return Err(());
    }
    // SAFETY: both ranges are inside the arrays (checked above); the helper only
    // reads them.
    let sum = unsafe {
        bpf_csum_diff(
            old.as_ptr().add(offset) as *mut u32,
            length,
            new.as_ptr().add(offset) as *mut u32,
            length,
            0,
        )
    };
    if sum < 0 {
        return Err(());
    }
    Ok(sum as u32)
}

/// The checksum (two bytes as stored) after a change whose [`difference`] is
/// `difference`.
#[inline(always)]
pub fn with_difference(checksum: [u8; 2], difference: u32) -> [u8; 2] {
    let mut sum = u64::from(!u16::from_ne_bytes(checksum)) + u64::from(difference);
    sum = (sum & 0xffff_ffff) + (sum >> 32);
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    (!(sum as u16)).to_ne_bytes()
}
