//! Parsing and rewriting IPv4 TCP/UDP packets behind an Ethernet header.
//!
//! Every read goes through `bpf_skb_load_bytes` (`TcContext::load`), which checks
//! bounds at run time, so the verifier never has to follow packet pointers and
//! the code stays far below its complexity limits.

use aya_ebpf::{
    bindings::{BPF_F_MARK_MANGLED_0, BPF_F_PSEUDO_HDR},
    helpers::bpf_skb_change_tail,
    programs::TcContext,
};
use core::{mem::offset_of, mem::MaybeUninit, ptr::write_volatile};

use switchyard_common::{ipv4_mapped, Address, ConntrackKey, PROTOCOL_TCP, PROTOCOL_UDP};

use crate::{checksum, fragments};

pub const ETHERNET_HEADER_LENGTH: usize = 14;
const ETHERNET_TYPE_IPV4: u16 = 0x0800;
const IP_OFFSET: usize = ETHERNET_HEADER_LENGTH;
const IP_CHECKSUM_OFFSET: usize = IP_OFFSET + 10;
const IP_SOURCE_OFFSET: usize = IP_OFFSET + 12;
const IP_DESTINATION_OFFSET: usize = IP_OFFSET + 16;
/// Ethernet, an IPv4 header without options, and the first 14 bytes of the L4
/// header (a TCP header up to its flags; a UDP header and 6 bytes of payload).
const COMMON_HEADERS_LENGTH: usize = ETHERNET_HEADER_LENGTH + 20 + 14;
const TCP_FLAG_FIN: u8 = 0x01;
const TCP_FLAG_SYN: u8 = 0x02;
const TCP_FLAG_RST: u8 = 0x04;
const TCP_FLAG_ACK: u8 = 0x10;
/// The IPv4 flags-and-offset field: "more fragments", and the fragment offset.
const MORE_FRAGMENTS: u16 = 0x2000;
const FRAGMENT_OFFSET: u16 = 0x1fff;

// The layout `Packet::conntrack_key` writes: addresses at even offsets, `reserved`
// at an odd one followed by an even pair.
const _: () = {
    assert!(core::mem::align_of::<ConntrackKey>() == 2);
    assert!(core::mem::size_of::<ConntrackKey>() == 40);
    assert!(offset_of!(ConntrackKey, source_address) % 2 == 0);
    assert!(offset_of!(ConntrackKey, destination_address) % 2 == 0);
    assert!(offset_of!(ConntrackKey, reserved) == 37);
};

/// Writes the IPv4-mapped form of `octets` (`::ffff:a.b.c.d`) at `target`.
///
/// # Safety
/// `target` is valid for 16 bytes of writes and aligned to 2.
#[inline(always)]
pub(crate) unsafe fn write_ipv4_mapped(target: *mut u8, octets: [u8; 4]) {
    let halves = target.cast::<u16>();
    for index in 0..5 {
        write_volatile(halves.add(index), 0);
    }
    write_volatile(halves.add(5), 0xffff);
    for (index, octet) in octets.into_iter().enumerate() {
        write_volatile(target.add(12 + index), octet);
    }
}

/// The fields of one packet the datapath looks at. Addresses and ports are kept
/// exactly as they are on the wire (network byte order).
pub struct Packet {
    pub protocol: u8,
    pub source_ipv4: [u8; 4],
    pub destination_ipv4: [u8; 4],
    pub source_port: u16,
    pub destination_port: u16,
    pub tcp_flags: u8,
    pub l4_offset: usize,
    /// A fragment after the first of its datagram: no transport header (the
    /// ports are those its first fragment carried, see `fragments`), so a
    /// rewrite changes only its addresses and IP header checksum.
    pub later_fragment: bool,
}

impl Packet {
    /// `None` for anything but an IPv4 TCP or UDP packet, whole or a fragment
    /// (a later fragment only if this hook, `seen_at` (`FRAGMENT_SEEN_AT_*`),
    /// saw its datagram's first): those pass untouched.
    #[inline(always)]
    pub fn parse(ctx: &TcContext, seen_at: u8) -> Option<Self> {
        // Helper calls are most of the per-packet cost: the common packet (no IP
        // options, at least the TCP header's flags or the UDP header and 6 bytes
        // behind it) is read in one call; anything else the long way.
        if let Ok(headers) = ctx.load::<[u8; COMMON_HEADERS_LENGTH]>(0) {
            if let Some(packet) = Self::from_common_headers(&headers) {
                return Some(packet);
            }
        }
        Self::parse_field_by_field(ctx, seen_at)
    }

    /// The packet from its first `COMMON_HEADERS_LENGTH` bytes, if it is an
    /// IPv4 TCP or UDP packet without IP options and not a fragment; `None`
    /// otherwise (the caller then takes the long way, which decides).
    #[inline(always)]
    fn from_common_headers(headers: &[u8; COMMON_HEADERS_LENGTH]) -> Option<Self> {
        if u16::from_be_bytes([headers[12], headers[13]]) != ETHERNET_TYPE_IPV4
            || headers[IP_OFFSET] != 0x45
            || u16::from_be_bytes([headers[IP_OFFSET + 6], headers[IP_OFFSET + 7]]) & 0x3fff != 0
        {
            return None;
        }
        let protocol = headers[IP_OFFSET + 9];
        if protocol != PROTOCOL_TCP && protocol != PROTOCOL_UDP {
            return None;
        }
        let l4_offset = IP_OFFSET + 20;
        Some(Self {
            protocol,
            source_ipv4: [
                headers[IP_SOURCE_OFFSET],
                headers[IP_SOURCE_OFFSET + 1],
                headers[IP_SOURCE_OFFSET + 2],
                headers[IP_SOURCE_OFFSET + 3],
            ],
            destination_ipv4: [
                headers[IP_DESTINATION_OFFSET],
                headers[IP_DESTINATION_OFFSET + 1],
                headers[IP_DESTINATION_OFFSET + 2],
                headers[IP_DESTINATION_OFFSET + 3],
            ],
            source_port: u16::from_ne_bytes([headers[l4_offset], headers[l4_offset + 1]]),
            destination_port: u16::from_ne_bytes([headers[l4_offset + 2], headers[l4_offset + 3]]),
            tcp_flags: if protocol == PROTOCOL_TCP {
                headers[l4_offset + 13]
            } else {
                0
            },
            l4_offset,
            later_fragment: false,
        })
    }

    #[inline(always)]
    fn parse_field_by_field(ctx: &TcContext, seen_at: u8) -> Option<Self> {
        let ethernet_type: u16 = ctx.load(12).ok()?;
        if u16::from_be(ethernet_type) != ETHERNET_TYPE_IPV4 {
            return None;
        }
        // The fixed IPv4 header in one read: helper calls are most of the
        // per-packet cost.
        let ip: [u8; 20] = ctx.load(IP_OFFSET).ok()?;
        if ip[0] >> 4 != 4 {
            return None;
        }
        let header_length = ((ip[0] & 0x0f) as usize) * 4;
        if header_length < 20 {
            return None;
        }
        let protocol = ip[9];
        if protocol != PROTOCOL_TCP && protocol != PROTOCOL_UDP {
            return None;
        }
        let source_ipv4 = [ip[12], ip[13], ip[14], ip[15]];
        let destination_ipv4 = [ip[16], ip[17], ip[18], ip[19]];
        let l4_offset = IP_OFFSET + header_length;
        let fragment = u16::from_be_bytes([ip[6], ip[7]]);
        let datagram = fragments::identity(u16::from_ne_bytes([ip[4], ip[5]]), protocol, seen_at);
        if fragment & FRAGMENT_OFFSET != 0 {
            // A later fragment: the ports its first fragment carried, if this
            // hook saw it (else it passes untouched, counted).
            let found = fragments::ports_of_later_fragment(
                u32::from_ne_bytes(source_ipv4),
                u32::from_ne_bytes(destination_ipv4),
                datagram,
            );
            if found & fragments::FOUND == 0 {
                return None;
            }
            let (source_port, destination_port) = fragments::unpack_ports(found);
            return Some(Self {
                protocol,
                source_ipv4,
                destination_ipv4,
                source_port,
                destination_port,
                tcp_flags: 0,
                l4_offset,
                later_fragment: true,
            });
        }
        // Both ports in one read, kept in wire order (the bytes read as native u16).
        let ports: [u8; 4] = ctx.load(l4_offset).ok()?;
        let source_port = u16::from_ne_bytes([ports[0], ports[1]]);
        let destination_port = u16::from_ne_bytes([ports[2], ports[3]]);
        let tcp_flags = if protocol == PROTOCOL_TCP {
            ctx.load(l4_offset + 13).ok()?
        } else {
            0
        };
        if fragment & MORE_FRAGMENTS != 0 {
            // The first fragment of a datagram: its later ones need its ports.
            fragments::remember_first_fragment(
                u32::from_ne_bytes(source_ipv4),
                u32::from_ne_bytes(destination_ipv4),
                datagram,
                fragments::pack_ports(source_port, destination_port),
            );
        }
        Some(Self {
            protocol,
            source_ipv4,
            destination_ipv4,
            source_port,
            destination_port,
            tcp_flags,
            l4_offset,
            later_fragment: false,
        })
    }

    #[inline(always)]
    pub fn destination_address(&self) -> Address {
        ipv4_mapped(self.destination_ipv4)
    }

    /// Writes this packet's conntrack key into `key` and returns it.
    ///
    /// Explicit stores, in place: initialised field by field (or copied out of a
    /// returned value), the zero bytes (the IPv4-mapped prefixes, `reserved`)
    /// become calls to a byte-by-byte `memset` subprogram, three per packet, which a
    /// profile put at about 30% of the programs' own time. Volatile stores are never
    /// merged into such a call, and writing into the caller's storage leaves no
    /// copy for the compiler to rebuild with one.
    #[inline(always)]
    pub fn write_conntrack_key<'a>(
        &self,
        key: &'a mut MaybeUninit<ConntrackKey>,
    ) -> &'a ConntrackKey {
        let base = key.as_mut_ptr().cast::<u8>();
        // SAFETY: every byte of the key is written, inside it, by byte stores and
        // by u16 stores at even offsets of a struct aligned to 2 (checked below).
        unsafe {
            write_ipv4_mapped(
                base.add(offset_of!(ConntrackKey, source_address)),
                self.source_ipv4,
            );
            write_ipv4_mapped(
                base.add(offset_of!(ConntrackKey, destination_address)),
                self.destination_ipv4,
            );
            write_volatile(
                base.add(offset_of!(ConntrackKey, source_port_big_endian))
                    .cast::<u16>(),
                self.source_port,
            );
            write_volatile(
                base.add(offset_of!(ConntrackKey, destination_port_big_endian))
                    .cast::<u16>(),
                self.destination_port,
            );
            let protocol = base.add(offset_of!(ConntrackKey, protocol));
            write_volatile(protocol, self.protocol);
            let reserved = base.add(offset_of!(ConntrackKey, reserved));
            write_volatile(reserved, 0);
            write_volatile(reserved.add(1).cast::<u16>(), 0);
            key.assume_init_ref()
        }
    }

    /// A connection's first packet: SYN without ACK.
    #[inline(always)]
    pub fn is_tcp_syn(&self) -> bool {
        self.protocol == PROTOCOL_TCP
            && self.tcp_flags & TCP_FLAG_SYN != 0
            && self.tcp_flags & TCP_FLAG_ACK == 0
    }

    /// The second packet of a TCP handshake: the server accepting a connection.
    #[inline(always)]
    pub fn is_tcp_syn_ack(&self) -> bool {
        self.protocol == PROTOCOL_TCP
            && self.tcp_flags & TCP_FLAG_SYN != 0
            && self.tcp_flags & TCP_FLAG_ACK != 0
    }

    #[inline(always)]
    pub fn is_tcp_fin(&self) -> bool {
        self.protocol == PROTOCOL_TCP && self.tcp_flags & TCP_FLAG_FIN != 0
    }

    #[inline(always)]
    pub fn is_tcp_reset(&self) -> bool {
        self.protocol == PROTOCOL_TCP && self.tcp_flags & TCP_FLAG_RST != 0
    }

    #[inline(always)]
    fn l4_checksum_offset(&self) -> usize {
        if self.protocol == PROTOCOL_TCP {
            self.l4_offset + 16
        } else {
            self.l4_offset + 6
        }
    }

    /// Flags for `bpf_l4_csum_replace`: a UDP checksum of zero means "none" and
    /// must stay zero.
    #[inline(always)]
    fn l4_checksum_flags(&self) -> u64 {
        if self.protocol == PROTOCOL_UDP {
            BPF_F_MARK_MANGLED_0 as u64
        } else {
            0
        }
    }
}

/// Where one end (source or destination) of the packet is, and what it holds.
struct Endpoint {
    address_offset: usize,
    port_offset: usize,
    old_ipv4: [u8; 4],
    old_port: u16,
}

/// Rewrites one address and port of the packet, fixing the IP and L4 checksums.
#[inline(always)]
fn rewrite_endpoint(
    ctx: &TcContext,
    packet: &Packet,
    endpoint: Endpoint,
    new_address: Address,
    new_port: u16,
) -> Result<(), ()> {
    let Endpoint {
        address_offset,
        port_offset,
        old_ipv4,
        old_port,
    } = endpoint;
    let new_ipv4 = [
        new_address[12],
        new_address[13],
        new_address[14],
        new_address[15],
    ];
    let l4_checksum_offset = packet.l4_checksum_offset();
    let l4_flags = packet.l4_checksum_flags();
    if new_ipv4 != old_ipv4 {
        let old_value = u32::from_ne_bytes(old_ipv4) as u64;
        let new_value = u32::from_ne_bytes(new_ipv4) as u64;
        // A later fragment has no transport checksum: where it would be is
        // payload. The first fragment's update covers the whole datagram.
        if !packet.later_fragment {
            ctx.l4_csum_replace(
                l4_checksum_offset,
                old_value,
                new_value,
                l4_flags | BPF_F_PSEUDO_HDR as u64 | 4,
            )
            .map_err(|_| ())?;
        }
        ctx.l3_csum_replace(IP_CHECKSUM_OFFSET, old_value, new_value, 4)
            .map_err(|_| ())?;
        ctx.store(address_offset, &new_ipv4, 0).map_err(|_| ())?;
    }
    // A later fragment's ports are its first fragment's, not in the packet.
    if new_port != old_port && !packet.later_fragment {
        ctx.l4_csum_replace(
            l4_checksum_offset,
            old_port as u64,
            new_port as u64,
            l4_flags | 2,
        )
        .map_err(|_| ())?;
        ctx.store(port_offset, &new_port, 0).map_err(|_| ())?;
    }
    Ok(())
}

#[inline(always)]
pub fn rewrite_destination(
    ctx: &TcContext,
    packet: &Packet,
    new_address: Address,
    new_port: u16,
) -> Result<(), ()> {
    let endpoint = Endpoint {
        address_offset: IP_DESTINATION_OFFSET,
        port_offset: packet.l4_offset + 2,
        old_ipv4: packet.destination_ipv4,
        old_port: packet.destination_port,
    };
    rewrite_endpoint(ctx, packet, endpoint, new_address, new_port)
}

#[inline(always)]
pub fn rewrite_source(
    ctx: &TcContext,
    packet: &Packet,
    new_address: Address,
    new_port: u16,
) -> Result<(), ()> {
    let endpoint = Endpoint {
        address_offset: IP_SOURCE_OFFSET,
        port_offset: packet.l4_offset,
        old_ipv4: packet.source_ipv4,
        old_port: packet.source_port,
    };
    rewrite_endpoint(ctx, packet, endpoint, new_address, new_port)
}

#[inline(always)]
pub fn swap_ethernet_addresses(ctx: &TcContext) -> Result<(), ()> {
    let addresses: [u8; 12] = ctx.load(0).map_err(|_| ())?;
    let mut swapped = [0u8; 12];
    swapped[..6].copy_from_slice(&addresses[6..]);
    swapped[6..].copy_from_slice(&addresses[..6]);
    ctx.store(0, &swapped, 0).map_err(|_| ())
}

const ICMP_HEADER_LENGTH: usize = 8;
/// What an ICMP error quotes of the original packet: its IP header (without
/// options) and the first 8 bytes of its payload (the ports).
const QUOTED_LENGTH: usize = 20 + 8;
const ICMP_PACKET_LENGTH: usize = 20 + ICMP_HEADER_LENGTH + QUOTED_LENGTH;

/// Turns the packet into an ICMP port unreachable from the frontend to the
/// client and sends it back out of the interface it came in on, as kube-proxy's
/// REJECT rule does: a TCP client in SYN_SENT gets ECONNREFUSED at once.
#[inline(always)]
pub fn reject_with_icmp_port_unreachable(ctx: &TcContext, packet: &Packet) -> Result<i32, ()> {
    if packet.l4_offset != IP_OFFSET + 20 {
        // IP options: not worth the complexity; the client times out instead.
        return Ok(crate::PASS);
    }
    let quoted: [u8; QUOTED_LENGTH] = ctx.load(IP_OFFSET).map_err(|_| ())?;
    let new_length = (ETHERNET_HEADER_LENGTH + ICMP_PACKET_LENGTH) as u32;
    // SAFETY: the context pointer is the one the kernel passed in.
    let result = unsafe { bpf_skb_change_tail(ctx.skb.skb, new_length, 0) };
    if result != 0 {
        return Err(());
    }

    let mut ip_header = [0u8; 20];
    ip_header[0] = 0x45;
    let total_length = (ICMP_PACKET_LENGTH as u16).to_be_bytes();
    ip_header[2] = total_length[0];
    ip_header[3] = total_length[1];
    ip_header[8] = 64; // TTL
    ip_header[9] = 1; // ICMP
    ip_header[12..16].copy_from_slice(&packet.destination_ipv4);
    ip_header[16..20].copy_from_slice(&packet.source_ipv4);
    let ip_checksum = checksum::fold(checksum::sum_words(&ip_header, 0));
    ip_header[10..12].copy_from_slice(&ip_checksum.to_be_bytes());

    let mut icmp_header = [0u8; ICMP_HEADER_LENGTH];
    icmp_header[0] = 3; // destination unreachable
    icmp_header[1] = 3; // port unreachable
    let partial = checksum::sum_words(&icmp_header, 0);
    // The quoted header's checksum field is left as it was on the wire.
    let icmp_checksum = checksum::fold(checksum::sum_words(&quoted, partial));
    icmp_header[2..4].copy_from_slice(&icmp_checksum.to_be_bytes());

    ctx.store(IP_OFFSET, &ip_header, 0).map_err(|_| ())?;
    ctx.store(IP_OFFSET + 20, &icmp_header, 0).map_err(|_| ())?;
    ctx.store(IP_OFFSET + 20 + ICMP_HEADER_LENGTH, &quoted, 0)
        .map_err(|_| ())?;
    crate::bounce(ctx)
}
