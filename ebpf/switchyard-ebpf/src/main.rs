//! Switchyard's kernel programs: Service translation at TC ingress/egress and in
//! the cgroup socket hooks. `docs/datapath.md` describes what they do; the map
//! types are in `switchyard-common`.
//!
//! Entry points are thin: each calls a `try_` body and turns its error into
//! "pass the packet on", so a bug or an unexpected packet never drops traffic.
//! There is no per-packet logging; the per-CPU counters say what happened.
#![no_std]
#![no_main]
// Map helpers take `impl Borrow<K>`: passing keys by reference keeps the verifier's
// 512-byte stack from holding extra copies of 40-byte keys.
#![allow(clippy::needless_borrows_for_generic_args)]

mod checksum;
mod conntrack;
mod packet;
mod socket;

use aya_ebpf::{
    bindings::{TC_ACT_REDIRECT, TC_ACT_UNSPEC},
    helpers::{bpf_get_prandom_u32, bpf_ktime_get_ns, bpf_redirect},
    macros::{cgroup_sock_addr, classifier, map},
    maps::{Array, HashMap, LruHashMap, PerCpuArray},
    programs::{SockAddrContext, TcContext},
};
use switchyard_common::{
    counter, AffinityKey, AffinityValue, BackendSlotKey, BackendValue, ConntrackKey,
    ConntrackValue, DatapathConfig, FrontendKey, FrontendValue, SocketReverseKey,
    SocketReverseValue, BACKEND_FLAG_LOCAL, CONNTRACK_FLAG_MASQUERADE, CONNTRACK_FLAG_REPLY,
    CONNTRACK_FLAG_REWRITE_DESTINATION, CONNTRACK_FLAG_REWRITE_SOURCE, DATAPATH_MODE_ACTIVE,
    FRONTEND_FLAG_MASQUERADE_REMOTE, FRONTEND_FLAG_PRESERVE_CLIENT_ADDRESS,
    FRONTEND_FLAG_SESSION_AFFINITY, PROTOCOL_TCP, SCOPE_EXTERNAL, SCOPE_INTERNAL,
};

use crate::packet::Packet;

/// Per-CPU LRU lists for conntrack: every new flow inserts two entries, and a
/// common LRU list would be a lock all CPUs contend for.
const BPF_F_NO_COMMON_LRU: u32 = 1 << 1;

/// "Next program, or the stack": `TCX_NEXT` under TCX and `TC_ACT_UNSPEC` under
/// clsact are the same value (-1), so one return code serves both attach modes.
pub const PASS: i32 = TC_ACT_UNSPEC;

// Sizes here are placeholders: the agent sets every size from its configuration
// at load time (`EbpfLoader::map_max_entries`), and reuses pinned maps as they are.
#[map(name = "SY_FRONTENDS")]
static FRONTENDS: HashMap<FrontendKey, FrontendValue> = HashMap::pinned(65_536, 0);
#[map(name = "SY_BACKENDS")]
static BACKEND_SLOTS: HashMap<BackendSlotKey, BackendValue> = HashMap::pinned(262_144, 0);
#[map(name = "SY_CONNTRACK")]
static CONNTRACK: LruHashMap<ConntrackKey, ConntrackValue> =
    LruHashMap::pinned(524_288, BPF_F_NO_COMMON_LRU);
#[map(name = "SY_AFFINITY")]
static AFFINITY: LruHashMap<AffinityKey, AffinityValue> = LruHashMap::pinned(65_536, 0);
#[map(name = "SY_CONFIG")]
static CONFIG: Array<DatapathConfig> = Array::pinned(1, 0);
#[map(name = "SY_COUNTERS")]
static COUNTERS: PerCpuArray<u64> = PerCpuArray::pinned(counter::COUNT, 0);
#[map(name = "SY_SOCK_REVERSE")]
static SOCKET_REVERSE: LruHashMap<SocketReverseKey, SocketReverseValue> =
    LruHashMap::pinned(65_536, 0);

#[classifier]
pub fn sy_ingress_pod(ctx: TcContext) -> i32 {
    try_ingress(&ctx, SCOPE_INTERNAL).unwrap_or_else(|()| count_error())
}

#[classifier]
pub fn sy_ingress_host(ctx: TcContext) -> i32 {
    try_ingress(&ctx, SCOPE_EXTERNAL).unwrap_or_else(|()| count_error())
}

#[classifier]
pub fn sy_egress(ctx: TcContext) -> i32 {
    try_egress(&ctx).unwrap_or_else(|()| count_error())
}

#[cgroup_sock_addr(connect4)]
pub fn sy_connect4(ctx: SockAddrContext) -> i32 {
    socket::try_connect4(&ctx)
}

#[cgroup_sock_addr(sendmsg4)]
pub fn sy_sendmsg4(ctx: SockAddrContext) -> i32 {
    socket::try_sendmsg4(&ctx)
}

#[cgroup_sock_addr(recvmsg4)]
pub fn sy_recvmsg4(ctx: SockAddrContext) -> i32 {
    socket::try_reverse(&ctx)
}

#[cgroup_sock_addr(getpeername4)]
pub fn sy_getpeername4(ctx: SockAddrContext) -> i32 {
    socket::try_reverse(&ctx)
}

#[inline(always)]
fn count(index: u32) {
    if let Some(value) = COUNTERS.get_ptr_mut(index) {
        // SAFETY: a per-CPU slot is only touched by this CPU, and programs do not
        // nest on one CPU for the same hook.
        unsafe { *value += 1 };
    }
}

#[inline(always)]
fn count_error() -> i32 {
    count(counter::ERROR);
    PASS
}

#[inline(always)]
fn config() -> Option<&'static DatapathConfig> {
    CONFIG.get(0)
}

/// The backend for a new flow from `client` to `frontend`: the client's affinity
/// entry if the frontend has session affinity and that entry is fresh and its slot
/// still holds the same backend, otherwise a uniformly random slot.
#[inline(always)]
fn choose_backend(
    frontend: &FrontendValue,
    client: &[u8; 16],
    now: u64,
) -> Option<(u32, BackendValue)> {
    let count = frontend.backend_count;
    if count == 0 {
        return None;
    }
    let affinity_key = AffinityKey {
        client_address: *client,
        group_id: frontend.group_id,
    };
    let with_affinity = frontend.flags & FRONTEND_FLAG_SESSION_AFFINITY != 0;
    if with_affinity {
        // SAFETY: the value is copied out at once; a concurrent update can at worst
        // give a stale choice, which the slot check below catches.
        if let Some(entry) = unsafe { AFFINITY.get(&affinity_key) } {
            let entry = *entry;
            let timeout = frontend.affinity_timeout_seconds as u64 * 1_000_000_000;
            if entry.ordinal < count && now.wrapping_sub(entry.last_used_nanoseconds) < timeout {
                let slot_key = BackendSlotKey {
                    group_id: frontend.group_id,
                    ordinal: entry.ordinal,
                };
                if let Some(slot) = unsafe { BACKEND_SLOTS.get(&slot_key) } {
                    if slot.address == entry.backend_address
                        && slot.port_big_endian == entry.backend_port_big_endian
                    {
                        let backend = *slot;
                        remember_affinity(&affinity_key, entry.ordinal, &backend, now);
                        return Some((entry.ordinal, backend));
                    }
                }
            }
        }
    }
    // SAFETY: helper without arguments.
    let ordinal = unsafe { bpf_get_prandom_u32() } % count;
    let slot_key = BackendSlotKey {
        group_id: frontend.group_id,
        ordinal,
    };
    let backend = *unsafe { BACKEND_SLOTS.get(&slot_key) }?;
    if with_affinity {
        remember_affinity(&affinity_key, ordinal, &backend, now);
    }
    Some((ordinal, backend))
}

#[inline(always)]
fn remember_affinity(key: &AffinityKey, ordinal: u32, backend: &BackendValue, now: u64) {
    let value = AffinityValue {
        backend_address: backend.address,
        backend_port_big_endian: backend.port_big_endian,
        reserved: 0,
        ordinal,
        last_used_nanoseconds: now,
    };
    // A full LRU map evicts its oldest entry; a failure only costs affinity.
    let _ = AFFINITY.insert(key, &value, 0);
}

fn try_ingress(ctx: &TcContext, scope: u8) -> Result<i32, ()> {
    let Some(packet) = Packet::parse(ctx) else {
        return Ok(PASS);
    };
    let Some(config) = config() else {
        return Ok(PASS);
    };
    // SAFETY: helper without arguments.
    let now = unsafe { bpf_ktime_get_ns() };
    let key = packet.conntrack_key();

    if let Some(entry) = CONNTRACK.get_ptr_mut(&key) {
        // SAFETY: the pointer is valid for this program run; fields are read and
        // written one at a time, which is what an LRU entry allows.
        let entry = unsafe { &mut *entry };
        let is_new_syn = packet.is_tcp_syn() && conntrack::is_closing(entry.tcp_state);
        if conntrack::is_live(entry, packet.protocol, config, now) && !is_new_syn {
            return conntrack::apply_at_ingress(
                ctx,
                &packet,
                &key,
                entry,
                config.masquerade_mark,
                now,
            );
        }
    }

    let frontend_key = FrontendKey {
        address: packet.destination_address(),
        port_big_endian: packet.destination_port,
        protocol: packet.protocol,
        scope,
    };
    // SAFETY: copied out at once.
    let Some(frontend) = (unsafe { FRONTENDS.get(&frontend_key) }).copied() else {
        return Ok(PASS);
    };
    count(counter::CONNTRACK_MISS);
    if packet.protocol == PROTOCOL_TCP && !packet.is_tcp_syn() {
        // A flow that netfilter (kube-proxy's rules) translated before the switch:
        // its netfilter conntrack entry keeps translating it, so leave it alone.
        count(counter::PASSED_UNTRACKED);
        return Ok(PASS);
    }
    if config.mode != DATAPATH_MODE_ACTIVE {
        return Ok(PASS);
    }
    if frontend.backend_count == 0 {
        count(counter::NO_BACKEND);
        return packet::reject_with_icmp_port_unreachable(ctx, &packet);
    }
    let client = packet.source_address();
    let Some((_, backend)) = choose_backend(&frontend, &client, now) else {
        return Err(());
    };

    let hairpin = backend.address == client;
    let masquerade = frontend.flags & FRONTEND_FLAG_MASQUERADE_REMOTE != 0
        && frontend.flags & FRONTEND_FLAG_PRESERVE_CLIENT_ADDRESS == 0
        && backend.flags & BACKEND_FLAG_LOCAL == 0
        && config.masquerade_mark != 0;
    // The address the backend sees as the client, and answers to.
    let (seen_client_address, seen_client_port) = if hairpin {
        (config.hairpin_address, packet.source_port)
    } else {
        (client, packet.source_port)
    };

    let mut forward_flags = CONNTRACK_FLAG_REWRITE_DESTINATION;
    if hairpin {
        forward_flags |= CONNTRACK_FLAG_REWRITE_SOURCE;
    }
    if masquerade {
        forward_flags |= CONNTRACK_FLAG_MASQUERADE;
    }
    let forward = ConntrackValue {
        new_source_address: seen_client_address,
        new_destination_address: backend.address,
        new_source_port_big_endian: seen_client_port,
        new_destination_port_big_endian: backend.port_big_endian,
        flags: forward_flags,
        tcp_state: 0,
        reserved: [0; 2],
        last_seen_nanoseconds: now,
    };
    let reply_key = ConntrackKey {
        source_address: backend.address,
        destination_address: seen_client_address,
        source_port_big_endian: backend.port_big_endian,
        destination_port_big_endian: seen_client_port,
        protocol: packet.protocol,
        reserved: [0; 3],
    };
    let mut reply_flags = CONNTRACK_FLAG_REPLY | CONNTRACK_FLAG_REWRITE_SOURCE;
    if hairpin {
        reply_flags |= CONNTRACK_FLAG_REWRITE_DESTINATION;
    }
    let reply = ConntrackValue {
        new_source_address: frontend_key.address,
        new_destination_address: client,
        new_source_port_big_endian: packet.destination_port,
        new_destination_port_big_endian: packet.source_port,
        flags: reply_flags,
        tcp_state: 0,
        reserved: [0; 2],
        last_seen_nanoseconds: now,
    };
    // Reply entry first: a reply can never arrive before the packet it answers has
    // been sent on, and that happens only after both writes.
    CONNTRACK.insert(&reply_key, &reply, 0).map_err(|_| ())?;
    CONNTRACK.insert(&key, &forward, 0).map_err(|_| ())?;
    count(counter::TRANSLATED);
    conntrack::rewrite_forward(ctx, &packet, &forward, config.masquerade_mark)
}

fn try_egress(ctx: &TcContext) -> Result<i32, ()> {
    let Some(packet) = Packet::parse(ctx) else {
        return Ok(PASS);
    };
    let key = packet.conntrack_key();
    let Some(entry) = CONNTRACK.get_ptr_mut(&key) else {
        return Ok(PASS);
    };
    let Some(config) = config() else {
        return Ok(PASS);
    };
    // SAFETY: see try_ingress.
    let entry = unsafe { &mut *entry };
    // Only plain replies are translated here; hairpin replies never reach egress
    // untranslated (ingress sends them straight back out).
    if entry.flags & CONNTRACK_FLAG_REPLY == 0
        || entry.flags & CONNTRACK_FLAG_REWRITE_DESTINATION != 0
    {
        return Ok(PASS);
    }
    let now = unsafe { bpf_ktime_get_ns() };
    if !conntrack::is_live(entry, packet.protocol, config, now) {
        return Ok(PASS);
    }
    conntrack::refresh(entry, &packet, &key, now);
    count(counter::REVERSE_TRANSLATED);
    packet::rewrite_source(
        ctx,
        &packet,
        entry.new_source_address,
        entry.new_source_port_big_endian,
    )?;
    Ok(PASS)
}

/// Sends the packet back out of the interface it arrived on (hairpin and ICMP
/// answers), with its Ethernet addresses swapped.
#[inline(always)]
fn bounce(ctx: &TcContext) -> Result<i32, ()> {
    packet::swap_ethernet_addresses(ctx)?;
    // SAFETY: reading a field of the context the kernel gave us.
    let ifindex = unsafe { (*ctx.skb.skb).ifindex };
    // SAFETY: plain helper call.
    let action = unsafe { bpf_redirect(ifindex, 0) };
    if action as i64 == TC_ACT_REDIRECT as i64 {
        Ok(TC_ACT_REDIRECT)
    } else {
        Err(())
    }
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
