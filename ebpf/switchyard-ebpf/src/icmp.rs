//! ICMP errors about translated flows, translated back the way netfilter's NAT
//! translates RELATED errors (`nf_nat_icmp_reply_translation`): destination
//! unreachable (port unreachable, fragmentation needed, ...), time exceeded and
//! parameter problem quote the header of the packet they are about, as that
//! packet was *after* translation. The sender only recognises the error (its
//! socket lookup uses the quoted addresses and ports) if the quote shows the
//! packet as it sent it: so the quoted header is translated back, its checksums
//! with it, and the outer address on the translated end's side.
//!
//! The quoted packet is one of a tracked flow, so the flow's own entries say
//! what to do: the quote, read backwards (its destination as source), is the
//! key of the entry that translates the direction the error travels in.
//! - At egress, towards a client: an error about a client-direction packet (from
//!   its backend, a router on the way, or this node) finds the flow's reply
//!   entry; the quote's destination goes back to the frontend (and a translated
//!   source port back to the client's). A masqueraded flow's error has already
//!   been de-masqueraded by netfilter, which tracks that leg, before egress.
//! - At ingress, towards a backend: an error about a reply (from the client, or a
//!   router on the client's side) finds the client-direction entry; the quote's
//!   source becomes the backend and the error goes to it.
//! - A hairpin flow's client and backend are one pod: its error about its own
//!   flow (to the hairpin address, or to the frontend) comes in at the pod's
//!   interface, finds either entry, gets both outer addresses translated and is
//!   sent straight back out, as the flow's packets are.
//!
//! Kept out of the packet path's functions: the callers reach it only for
//! packets that are not TCP or UDP, and it is a function of its own, so its
//! instructions and stack are verified once and never add to the hot path's.

use aya_ebpf::{helpers::bpf_ktime_get_ns, programs::TcContext};
use core::mem::MaybeUninit;

use switchyard_common::{
    ConntrackValue, CONNTRACK_FLAG_PORT_TRANSLATED, CONNTRACK_FLAG_REPLY,
    CONNTRACK_FLAG_REWRITE_DESTINATION, CONNTRACK_FLAG_REWRITE_SOURCE, PROTOCOL_TCP, PROTOCOL_UDP,
};

use crate::{
    checksum, config, conntrack, count_error,
    packet::{Packet, ETHERNET_HEADER_LENGTH},
    PASS,
};

const ETHERNET_TYPE_IPV4: u16 = 0x0800;
const PROTOCOL_ICMP: u8 = 1;
const ICMP_DESTINATION_UNREACHABLE: u8 = 3;
const ICMP_TIME_EXCEEDED: u8 = 11;
const ICMP_PARAMETER_PROBLEM: u8 = 12;
const IP_OFFSET: usize = ETHERNET_HEADER_LENGTH;
const IP_CHECKSUM_OFFSET: usize = IP_OFFSET + 10;
const IP_SOURCE_OFFSET: usize = IP_OFFSET + 12;
const IP_DESTINATION_OFFSET: usize = IP_OFFSET + 16;
const ICMP_HEADER_LENGTH: usize = 8;
/// The quoted IP header (without options: a quote with options is left alone)
/// and the 8 bytes of transport header every error carries (the ports, and for
/// UDP its checksum).
const QUOTE_LENGTH: usize = 20 + 8;
/// Where the quote's fields are, from its start.
const QUOTE_CHECKSUM: usize = 10;
const QUOTE_SOURCE: usize = 12;
const QUOTE_DESTINATION: usize = 16;
const QUOTE_SOURCE_PORT: usize = 20;
const QUOTE_DESTINATION_PORT: usize = 22;
const QUOTE_UDP_CHECKSUM: usize = 26;
/// The quoted TCP checksum, past the 8 bytes: translated only when the error
/// quotes that much (Linux quotes up to 576 bytes), as netfilter does.
const QUOTE_TCP_CHECKSUM: usize = 20 + 16;

/// Which way the error travels, so which entry may translate it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// TC ingress: errors about replies, on their way to a backend, and a
    /// hairpin flow's errors, sent back to its pod.
    ToBackend,
    /// TC egress: errors about client-direction packets, on their way to a client.
    ToClient,
}

/// Translates the packet if it is an ICMP error about a translated flow; every
/// other packet passes untouched.
// A function of its own (a BPF-to-BPF call): see the module comment. So are its
// two halves, whose buffers would not fit one 512-byte frame together.
#[inline(never)]
pub fn translate_error(ctx: &TcContext, direction: Direction) -> i32 {
    try_translate_error(ctx, direction).unwrap_or_else(|()| count_error())
}

#[inline(always)]
fn ipv4_at(bytes: &[u8], offset: usize) -> [u8; 4] {
    [
        bytes[offset],
        bytes[offset + 1],
        bytes[offset + 2],
        bytes[offset + 3],
    ]
}

/// The ICMP header and the quote, read in one helper call.
#[repr(C)]
struct Message {
    header: [u8; ICMP_HEADER_LENGTH],
    quote: [u8; QUOTE_LENGTH],
}

/// What the quote becomes: the addresses and ports (as on the wire) the sender
/// of the quoted packet knows.
#[repr(C)]
struct QuoteRewrite {
    source: [u8; 4],
    destination: [u8; 4],
    source_port: [u8; 2],
    destination_port: [u8; 2],
}

#[inline(always)]
fn try_translate_error(ctx: &TcContext, direction: Direction) -> Result<i32, ()> {
    // The Ethernet type first: ARP and IPv6 leave after one read.
    let Ok(ethernet_type) = ctx.load::<[u8; 2]>(12) else {
        return Ok(PASS);
    };
    if u16::from_be_bytes(ethernet_type) != ETHERNET_TYPE_IPV4 {
        return Ok(PASS);
    }
    let Ok(ip) = ctx.load::<[u8; 20]>(IP_OFFSET) else {
        return Ok(PASS);
    };
    if ip[0] >> 4 != 4
        || ip[9] != PROTOCOL_ICMP
        // Only whole packets: an error is never fragmented in practice.
        || u16::from_be_bytes([ip[6], ip[7]]) & 0x3fff != 0
    {
        return Ok(PASS);
    }
    let header_length = ((ip[0] & 0x0f) as usize) * 4;
    if header_length < 20 {
        return Ok(PASS);
    }
    let icmp_offset = IP_OFFSET + header_length;
    let Ok(message) = ctx.load::<Message>(icmp_offset) else {
        return Ok(PASS);
    };
    if !matches!(
        message.header[0],
        ICMP_DESTINATION_UNREACHABLE | ICMP_TIME_EXCEEDED | ICMP_PARAMETER_PROBLEM
    ) {
        return Ok(PASS);
    }
    let mut rewrite = QuoteRewrite {
        source: [0; 4],
        destination: [0; 4],
        source_port: [0; 2],
        destination_port: [0; 2],
    };
    let outer = match find_rewrite(&message, direction, &mut rewrite) {
        FOUND_NONE => return Ok(PASS),
        FOUND_HAIRPIN => Outer::Both,
        _ => match direction {
            Direction::ToClient => Outer::Source,
            Direction::ToBackend => Outer::Destination,
        },
    };
    if apply_rewrite(ctx, icmp_offset, &message, &rewrite, outer) != 0 {
        return Err(());
    }
    if outer == Outer::Both {
        return Ok(BOUNCE);
    }
    Ok(PASS)
}

/// What `translate_error` returns for a hairpin flow's error (no TC action has
/// this value): the caller sends it straight back out (`crate::bounce`), so that
/// the Ethernet buffers of the bounce are not on this function's stack.
pub const BOUNCE: i32 = i32::MIN + 1;

/// What `find_rewrite` found (a BPF call returns a scalar): no flow of ours, a
/// flow, or a hairpin flow.
const FOUND_NONE: u8 = 0;
const FOUND_FLOW: u8 = 1;
const FOUND_HAIRPIN: u8 = 2;

/// Which outer addresses an error gets translated.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Outer {
    /// Towards a client: the source becomes the frontend.
    Source,
    /// Towards a backend: the destination becomes the backend.
    Destination,
    /// A hairpin flow's error: both, as the flow's own packets.
    Both,
}

/// Whether the quote in `message` is a packet of a live translated flow whose
/// entry translates `direction` (`FOUND_FLOW`), or of a hairpin flow at
/// ingress (`FOUND_HAIRPIN`); if so, what the quote becomes, in `rewrite`.
#[inline(never)]
fn find_rewrite(message: &Message, direction: Direction, rewrite: &mut QuoteRewrite) -> u8 {
    let quote = &message.quote;
    let protocol = quote[9];
    if quote[0] != 0x45
        || (protocol != PROTOCOL_TCP && protocol != PROTOCOL_UDP)
        // A later fragment's quote holds no ports.
        || u16::from_be_bytes([quote[6], quote[7]]) & 0x1fff != 0
    {
        return FOUND_NONE;
    }
    // What the quote holds; the entry replaces what it translates. Kept in the
    // caller's `rewrite` rather than in values that would live across the map
    // lookups (spilled to this frame, which the egress call chain cannot spare).
    rewrite.source = ipv4_at(quote, QUOTE_SOURCE);
    rewrite.source_port = [quote[QUOTE_SOURCE_PORT], quote[QUOTE_SOURCE_PORT + 1]];
    rewrite.destination = ipv4_at(quote, QUOTE_DESTINATION);
    rewrite.destination_port = [
        quote[QUOTE_DESTINATION_PORT],
        quote[QUOTE_DESTINATION_PORT + 1],
    ];
    // The quoted packet read backwards: the direction this error travels in,
    // its key written in place (see `Packet::write_conntrack_key`).
    let backwards = Packet {
        protocol,
        source_ipv4: rewrite.destination,
        destination_ipv4: rewrite.source,
        source_port: u16::from_ne_bytes(rewrite.destination_port),
        destination_port: u16::from_ne_bytes(rewrite.source_port),
        tcp_flags: 0,
        l4_offset: 0,
        later_fragment: false,
    };
    let mut key_storage = MaybeUninit::uninit();
    let key = backwards.write_conntrack_key(&mut key_storage);
    let Some(entry) = conntrack::find_entry(key) else {
        return FOUND_NONE;
    };
    // SAFETY: valid for this program run; read only (an error never refreshes
    // its flow: it is no sign of life).
    let entry: &ConntrackValue = unsafe { &*entry };
    let flags = entry.flags;
    let both = CONNTRACK_FLAG_REWRITE_SOURCE | CONNTRACK_FLAG_REWRITE_DESTINATION;
    let hairpin = flags & CONNTRACK_FLAG_PORT_TRANSLATED == 0 && flags & both == both;
    if hairpin {
        // Both ends are the pod behind this interface: only its own error,
        // coming in, is about this flow.
        if direction != Direction::ToBackend {
            return FOUND_NONE;
        }
    } else if (flags & CONNTRACK_FLAG_REPLY != 0) != (direction == Direction::ToClient) {
        return FOUND_NONE;
    }
    let Some(config) = config() else {
        return FOUND_NONE;
    };
    // SAFETY: helper without arguments.
    let now = unsafe { bpf_ktime_get_ns() };
    if !conntrack::is_live(entry, protocol, config, now) {
        return FOUND_NONE;
    }
    // The entry translates the backwards packet; the quote is that packet's
    // mirror image, so its source takes the entry's new destination and its
    // destination the entry's new source.
    if flags & CONNTRACK_FLAG_REWRITE_DESTINATION != 0 {
        rewrite.source = ipv4_at(&entry.new_destination_address, 12);
        rewrite.source_port = entry.new_destination_port_big_endian.to_ne_bytes();
    }
    if flags & CONNTRACK_FLAG_REWRITE_SOURCE != 0 {
        rewrite.destination = ipv4_at(&entry.new_source_address, 12);
        rewrite.destination_port = entry.new_source_port_big_endian.to_ne_bytes();
    }
    if hairpin {
        FOUND_HAIRPIN
    } else {
        FOUND_FLOW
    }
}

/// Writes `rewrite` into the quote of `message` (at `icmp_offset`), with every
/// checksum, and the `outer` addresses. Zero on success (a BPF call returns a
/// scalar).
#[inline(never)]
fn apply_rewrite(
    ctx: &TcContext,
    icmp_offset: usize,
    message: &Message,
    rewrite: &QuoteRewrite,
    outer: Outer,
) -> i32 {
    match try_apply_rewrite(ctx, icmp_offset, message, rewrite, outer) {
        Ok(()) => 0,
        Err(()) => -1,
    }
}

#[inline(always)]
fn try_apply_rewrite(
    ctx: &TcContext,
    icmp_offset: usize,
    message: &Message,
    rewrite: &QuoteRewrite,
    outer: Outer,
) -> Result<(), ()> {
    let quote_offset = icmp_offset + ICMP_HEADER_LENGTH;
    let quote = &message.quote;
    let protocol = quote[9];
    let mut translated = *quote;
    translated[QUOTE_SOURCE..QUOTE_SOURCE + 4].copy_from_slice(&rewrite.source);
    translated[QUOTE_DESTINATION..QUOTE_DESTINATION + 4].copy_from_slice(&rewrite.destination);
    translated[QUOTE_SOURCE_PORT..QUOTE_SOURCE_PORT + 2].copy_from_slice(&rewrite.source_port);
    translated[QUOTE_DESTINATION_PORT..QUOTE_DESTINATION_PORT + 2]
        .copy_from_slice(&rewrite.destination_port);

    // Checksums are updated by difference (`bpf_csum_diff`, as the kernel's
    // own incremental updates): a checksum that was wrong stays wrong.
    // The quoted IP header's, over its addresses.
    let addresses = checksum::difference(quote, &translated, QUOTE_SOURCE, 8)?;
    let inner_checksum = checksum::with_difference(
        [quote[QUOTE_CHECKSUM], quote[QUOTE_CHECKSUM + 1]],
        addresses,
    );
    translated[QUOTE_CHECKSUM..QUOTE_CHECKSUM + 2].copy_from_slice(&inner_checksum);
    // The quoted transport checksum, over the pseudo-header's addresses and the
    // ports, where the quote holds it. A UDP checksum of zero means "none".
    let ports_and_addresses = checksum::difference(quote, &translated, QUOTE_SOURCE, 12)?;
    let mut tcp_checksum = None;
    if protocol == PROTOCOL_UDP {
        let old = [quote[QUOTE_UDP_CHECKSUM], quote[QUOTE_UDP_CHECKSUM + 1]];
        if old != [0, 0] {
            let mut new = checksum::with_difference(old, ports_and_addresses);
            if new == [0, 0] {
                new = [0xff, 0xff];
            }
            translated[QUOTE_UDP_CHECKSUM..QUOTE_UDP_CHECKSUM + 2].copy_from_slice(&new);
        }
    } else if let Ok(old) = ctx.load::<[u8; 2]>(quote_offset + QUOTE_TCP_CHECKSUM) {
        tcp_checksum = Some((old, checksum::with_difference(old, ports_and_addresses)));
    }

    // The ICMP checksum covers everything changed in the quote.
    let mut icmp = checksum::with_difference(
        [message.header[2], message.header[3]],
        checksum::difference(quote, &translated, 0, QUOTE_LENGTH as u32)?,
    );
    if let Some((old, new)) = tcp_checksum {
        icmp = checksum::adjust(icmp, &old, &new);
        ctx.store(quote_offset + QUOTE_TCP_CHECKSUM, &new, 0)
            .map_err(|_| ())?;
    }
    ctx.store(quote_offset, &translated, 0).map_err(|_| ())?;
    ctx.store(icmp_offset + 2, &icmp, 0).map_err(|_| ())?;

    // The outer header, as netfilter's NAT sets it for a RELATED error: towards
    // a client the error comes from the frontend (whoever sent it: the backend, a
    // router or this node), towards a backend it goes to the backend (it was
    // sent to the frontend address the reply came from).
    let addresses: [u8; 8] = ctx.load(IP_SOURCE_OFFSET).map_err(|_| ())?;
    if outer != Outer::Destination {
        rewrite_outer_address(
            ctx,
            IP_SOURCE_OFFSET,
            ipv4_at(&addresses, 0),
            rewrite.destination,
        )?;
    }
    if outer != Outer::Source {
        rewrite_outer_address(
            ctx,
            IP_DESTINATION_OFFSET,
            ipv4_at(&addresses, 4),
            rewrite.source,
        )?;
    }
    Ok(())
}

/// Replaces one outer IPv4 address, fixing the header checksum (ICMP has no
/// pseudo-header, so its own checksum is unaffected).
#[inline(always)]
fn rewrite_outer_address(
    ctx: &TcContext,
    offset: usize,
    old: [u8; 4],
    new: [u8; 4],
) -> Result<(), ()> {
    if old == new {
        return Ok(());
    }
    ctx.l3_csum_replace(
        IP_CHECKSUM_OFFSET,
        u32::from_ne_bytes(old) as u64,
        u32::from_ne_bytes(new) as u64,
        4,
    )
    .map_err(|_| ())?;
    ctx.store(offset, &new, 0).map_err(|_| ())
}
