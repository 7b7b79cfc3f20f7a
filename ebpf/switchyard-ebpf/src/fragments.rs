//! IPv4 fragment tracking, as Cilium does it (its `IPV4_FRAG_DATAGRAMS_MAP`):
//! only the first fragment of a datagram carries the transport header, so each
//! TC hook records the ports of every first fragment it sees, under the fields
//! all fragments of that datagram share (addresses, protocol, IP identification),
//! and gives them to the datagram's later fragments. A later fragment then takes
//! the same path as a whole packet (conntrack lookup, the entry's rewrite), with
//! only its addresses and IP header checksum rewritten: the transport checksum,
//! in the first fragment, covers the whole datagram, and its incremental update
//! there for the changed addresses (pseudo-header) and ports is already the
//! right one, whatever the payload in the other fragments.
//!
//! Every first fragment is recorded, not only those of Service traffic: a later
//! fragment found nowhere is then one whose first this hook really never saw
//! (lost, reordered, or forgotten by the LRU), which is counted, and passed on
//! untranslated (reassembly drops its datagram, as it would any incomplete one).
//!
//! Both functions are calls of their own (BPF-to-BPF), taking scalars, so their
//! keys stay off the packet path's stack and their instructions are verified
//! once rather than at each place the packet is parsed.

use aya_ebpf::{
    macros::map,
    maps::{LruHashMap, PerCpuArray},
};
use core::{
    mem::{offset_of, MaybeUninit},
    ptr::write_volatile,
};

use switchyard_common::{FragmentKey, FragmentPorts};

use crate::packet::write_ipv4_mapped;

/// Datagrams in flight at once, node-wide, before the oldest record is
/// forgotten (Cilium's default size). A record lives for the few microseconds
/// between a datagram's fragments; the LRU makes room by itself.
#[map(name = "SY_FRAGMENTS")]
static FRAGMENTS: LruHashMap<FragmentKey, FragmentPorts> = LruHashMap::pinned(8_192, 0);

/// Later fragments without a record of their first, per CPU.
#[map(name = "SY_FRAG_ORPHANS")]
static FRAGMENTS_WITHOUT_FIRST: PerCpuArray<u64> = PerCpuArray::pinned(1, 0);

/// What `ports_of_later_fragment` returns when it found a record: the bit above
/// the 32 bits of the ports.
pub const FOUND: u64 = 1 << 32;

/// The datagram's identity (its IP identification as on the wire, protocol, and
/// `FRAGMENT_SEEN_AT_*`) in one scalar, the third argument of both calls.
#[inline(always)]
pub fn identity(identification_big_endian: u16, protocol: u8, seen_at: u8) -> u32 {
    identification_big_endian as u32 | (protocol as u32) << 16 | (seen_at as u32) << 24
}

/// Two ports (as on the wire) in one scalar, and back.
#[inline(always)]
pub fn pack_ports(source_port: u16, destination_port: u16) -> u32 {
    source_port as u32 | (destination_port as u32) << 16
}

#[inline(always)]
pub fn unpack_ports(packed: u64) -> (u16, u16) {
    (packed as u16, (packed >> 16) as u16)
}

/// Writes the key in place with explicit stores (see
/// `Packet::write_conntrack_key`: zero bytes written otherwise become calls to a
/// byte-by-byte `memset`).
#[inline(always)]
fn write_key(
    key: &mut MaybeUninit<FragmentKey>,
    source_ipv4: u32,
    destination_ipv4: u32,
    identity: u32,
) -> &FragmentKey {
    let base = key.as_mut_ptr().cast::<u8>();
    // SAFETY: every byte of the key is written, inside it: the addresses by
    // `write_ipv4_mapped` at even offsets of a struct aligned to 2, the rest by
    // a u16 store at an even offset and byte stores.
    unsafe {
        write_ipv4_mapped(
            base.add(offset_of!(FragmentKey, source_address)),
            source_ipv4.to_ne_bytes(),
        );
        write_ipv4_mapped(
            base.add(offset_of!(FragmentKey, destination_address)),
            destination_ipv4.to_ne_bytes(),
        );
        write_volatile(
            base.add(offset_of!(FragmentKey, identification_big_endian))
                .cast::<u16>(),
            identity as u16,
        );
        write_volatile(
            base.add(offset_of!(FragmentKey, protocol)),
            (identity >> 16) as u8,
        );
        write_volatile(
            base.add(offset_of!(FragmentKey, seen_at)),
            (identity >> 24) as u8,
        );
        key.assume_init_ref()
    }
}

// The layout `write_key` writes.
const _: () = {
    assert!(core::mem::align_of::<FragmentKey>() == 2);
    assert!(core::mem::size_of::<FragmentKey>() == 36);
    assert!(offset_of!(FragmentKey, source_address) == 0);
    assert!(offset_of!(FragmentKey, destination_address) == 16);
    assert!(offset_of!(FragmentKey, identification_big_endian) == 32);
};

/// Records the ports of a first fragment (addresses as the octets read as a
/// native `u32`, `identity` from [`identity`], `ports` from [`pack_ports`]).
#[inline(never)]
pub fn remember_first_fragment(source_ipv4: u32, destination_ipv4: u32, identity: u32, ports: u32) {
    let mut key_storage = MaybeUninit::uninit();
    let key = write_key(&mut key_storage, source_ipv4, destination_ipv4, identity);
    let (source_port, destination_port) = unpack_ports(ports as u64);
    let value = FragmentPorts {
        source_port_big_endian: source_port,
        destination_port_big_endian: destination_port,
    };
    // A full LRU evicts its oldest record; a failure only costs this datagram
    // its later fragments' translation (counted when they come).
    let _ = FRAGMENTS.insert(key, &value, 0);
}

/// The ports recorded for a later fragment's datagram, packed as by
/// [`pack_ports`] with [`FOUND`] set; zero (and counted) if there is no record.
#[inline(never)]
pub fn ports_of_later_fragment(source_ipv4: u32, destination_ipv4: u32, identity: u32) -> u64 {
    let mut key_storage = MaybeUninit::uninit();
    let key = write_key(&mut key_storage, source_ipv4, destination_ipv4, identity);
    // SAFETY: copied out at once; a concurrent update of the same datagram
    // writes the same ports.
    match unsafe { FRAGMENTS.get(key) } {
        Some(ports) => {
            FOUND
                | pack_ports(
                    ports.source_port_big_endian,
                    ports.destination_port_big_endian,
                ) as u64
        }
        None => {
            if let Some(count) = FRAGMENTS_WITHOUT_FIRST.get_ptr_mut(0) {
                // SAFETY: this CPU's slot; programs do not nest on one CPU.
                unsafe { *count += 1 };
            }
            0
        }
    }
}
