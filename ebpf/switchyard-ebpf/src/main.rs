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
mod fragments;
mod icmp;
mod packet;
mod sock_ops;
mod socket;

use aya_ebpf::{
    bindings::{TC_ACT_REDIRECT, TC_ACT_SHOT, TC_ACT_UNSPEC},
    helpers::{bpf_get_prandom_u32, bpf_ktime_get_ns, bpf_redirect},
    macros::{cgroup_sock, cgroup_sock_addr, classifier, map},
    maps::{
        lpm_trie::{Key as LpmKey, LpmTrie},
        Array, HashMap, LruHashMap, PerCpuArray,
    },
    programs::{SockAddrContext, SockContext, TcContext},
};
use switchyard_common::{
    counter, port_filter, refusal, AffinityKey, AffinityValue, BackendSlotKey, BackendValue,
    ConntrackKey, ConntrackValue, DatapathConfig, FrontendKey, FrontendValue, SocketReverseKey,
    SocketReverseValue, SourceRangeKey, BACKEND_FLAG_LOCAL, CONNTRACK_FLAG_MASQUERADE,
    CONNTRACK_FLAG_PORT_TRANSLATED, CONNTRACK_FLAG_RECORDS_REPLY, CONNTRACK_FLAG_REPLY,
    CONNTRACK_FLAG_REWRITE_DESTINATION, CONNTRACK_FLAG_REWRITE_SOURCE, DATAPATH_MODE_ACTIVE,
    FRAGMENT_SEEN_AT_EGRESS, FRAGMENT_SEEN_AT_INGRESS, FRONTEND_FLAG_DROP_WITHOUT_BACKENDS,
    FRONTEND_FLAG_ENDPOINTS_ELSEWHERE, FRONTEND_FLAG_MASQUERADE_REMOTE,
    FRONTEND_FLAG_PRESERVE_CLIENT_ADDRESS, FRONTEND_FLAG_SESSION_AFFINITY,
    FRONTEND_FLAG_SOURCE_RANGES, PROTOCOL_TCP, PROTOCOL_UDP, SCOPE_EXTERNAL, SCOPE_INTERNAL,
    SOURCE_RANGE_FRONTEND_BITS,
};

use core::mem::MaybeUninit;

use crate::packet::Packet;

/// Per-CPU LRU lists for the conntrack overflow: a common LRU list would be a
/// lock all CPUs contend for.
const BPF_F_NO_COMMON_LRU: u32 = 1 << 1;

/// "Next program, or the stack": `TCX_NEXT` under TCX and `TC_ACT_UNSPEC` under
/// clsact are the same value (-1), so one return code serves both attach modes.
pub const PASS: i32 = TC_ACT_UNSPEC;

/// Source ports tried for a new flow whose backend-side tuple is held by another
/// live flow, before it takes the tuple over anyway (see `held_by_another_flow`).
const PORT_TRANSLATION_ATTEMPTS: u32 = 4;
/// Translated source ports are drawn from 1024-65535, as netfilter's NAT does.
const FIRST_TRANSLATED_PORT: u32 = 1024;

// Sizes here are placeholders: the agent sets every size from its configuration
// at load time (`EbpfLoader::map_max_entries`), and reuses pinned maps as they are.
#[map(name = "SY_FRONTENDS")]
static FRONTENDS: HashMap<FrontendKey, FrontendValue> = HashMap::pinned(65_536, 0);
#[map(name = "SY_BACKENDS")]
static BACKEND_SLOTS: HashMap<BackendSlotKey, BackendValue> = HashMap::pinned(262_144, 0);
/// Flows, in a preallocated plain hash: an LRU insert scans its lists for room
/// on every new flow, which measurably cut the new-connection rate (see
/// `docs/datapath.md`, "Connection tracking"). The agent removes expired entries
/// (`node-agent/src/loader/expiry.rs`); a flow the full hash cannot take goes to
/// `CONNTRACK_OVERFLOW`, which evicts, so no new flow is ever refused for room.
#[map(name = "SY_CONNTRACK")]
static CONNTRACK: HashMap<ConntrackKey, ConntrackValue> = HashMap::pinned(524_288, 0);
#[map(name = "SY_CT_OVERFLOW")]
static CONNTRACK_OVERFLOW: LruHashMap<ConntrackKey, ConntrackValue> =
    LruHashMap::pinned(65_536, BPF_F_NO_COMMON_LRU);
#[map(name = "SY_AFFINITY")]
static AFFINITY: LruHashMap<AffinityKey, AffinityValue> = LruHashMap::pinned(65_536, 0);
#[map(name = "SY_CONFIG")]
static CONFIG: Array<DatapathConfig> = Array::pinned(1, 0);
#[map(name = "SY_COUNTERS")]
static COUNTERS: PerCpuArray<u64> = PerCpuArray::pinned(counter::COUNT, 0);
/// Room for a new flow's keys and entries while they are built (see
/// `on_conntrack_miss`). It holds nothing between two packets, but it is pinned
/// like the other maps: a program's identity includes the maps it uses, and a
/// fresh map at every start would make the next process replace programs that
/// are in fact identical. Its value type is private to the programs; it changes
/// only with the shared types it is made of, which bump `SCHEMA_VERSION` (so the
/// pin directory) anyway. The loader's schema leaves it alone (not one of
/// `map_names`): nothing in it needs converting.
#[map(name = "SY_NEW_FLOW")]
static SCRATCH: PerCpuArray<NewFlow> = PerCpuArray::pinned(1, 0);

#[repr(C)]
#[derive(Clone, Copy)]
struct NewFlow {
    key: ConntrackKey,
    frontend_key: FrontendKey,
    frontend: FrontendValue,
    backend: BackendValue,
    affinity_key: AffinityKey,
    affinity: AffinityValue,
    reply_key: ConntrackKey,
    reply: ConntrackValue,
    forward: ConntrackValue,
}

/// Which ports frontends and backends use: see `switchyard_common::port_filter`.
#[map(name = "SY_PORTS")]
static PORT_FILTER: Array<u8> = Array::pinned(port_filter::ENTRIES, 0);

/// `loadBalancerSourceRanges`: which sources each filtered frontend admits (see
/// `switchyard_common::SourceRangeKey`). Written by the agent only; sized for
/// 65,536 ranges (an LPM trie allocates per entry, so room costs nothing).
#[map(name = "SY_SRC_RANGES")]
static SOURCE_RANGES: LpmTrie<SourceRangeKey, u8> = LpmTrie::pinned(65_536, 0);
/// Packets dropped by the source ranges, per CPU.
#[map(name = "SY_SRC_DROPS")]
static SOURCE_RANGE_DROPS: PerCpuArray<u64> = PerCpuArray::pinned(1, 0);

/// New flows refused for lack of a backend, per CPU, by `refusal` index.
#[map(name = "SY_REFUSALS")]
static REFUSALS: PerCpuArray<u64> = PerCpuArray::pinned(refusal::COUNT, 0);

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
    socket::try_reverse_datagram(&ctx)
}

#[cgroup_sock_addr(getpeername4)]
pub fn sy_getpeername4(ctx: SockAddrContext) -> i32 {
    socket::try_reverse_peer_name(&ctx)
}

#[cgroup_sock_addr(connect6)]
pub fn sy_connect6(ctx: SockAddrContext) -> i32 {
    socket::try_connect6(&ctx)
}

#[cgroup_sock_addr(sendmsg6)]
pub fn sy_sendmsg6(ctx: SockAddrContext) -> i32 {
    socket::try_sendmsg6(&ctx)
}

#[cgroup_sock_addr(recvmsg6)]
pub fn sy_recvmsg6(ctx: SockAddrContext) -> i32 {
    socket::try_reverse_datagram6(&ctx)
}

#[cgroup_sock_addr(getpeername6)]
pub fn sy_getpeername6(ctx: SockAddrContext) -> i32 {
    socket::try_reverse_peer_name6(&ctx)
}

#[cgroup_sock(sock_release)]
pub fn sy_sock_release(ctx: SockContext) -> i32 {
    socket::try_forget_peer(&ctx)
}

#[inline(always)]
fn count(index: u32) {
    if let Some(value) = COUNTERS.get_ptr_mut(index) {
        // SAFETY: a per-CPU slot is only touched by this CPU, and programs do not
        // nest on one CPU for the same hook.
        unsafe { *value += 1 };
    }
}

/// Counts a packet (TC) or a connect/send (socket hooks) refused by the source
/// ranges of its frontend.
#[inline(always)]
fn count_source_range_drop() {
    if let Some(value) = SOURCE_RANGE_DROPS.get_ptr_mut(0) {
        // SAFETY: as in `count`.
        unsafe { *value += 1 };
    }
}

/// Counts a new flow (TC) or a connect/send (socket hooks) refused because
/// `frontend` has no backend, split by whether the Service has endpoints
/// elsewhere (as the agent flagged the frontend). The rare path only.
#[inline(always)]
fn count_refusal(frontend: &FrontendValue) {
    count(counter::NO_BACKEND);
    let index = if frontend.flags & FRONTEND_FLAG_ENDPOINTS_ELSEWHERE != 0 {
        refusal::WITH_ENDPOINTS_ELSEWHERE
    } else {
        refusal::WITHOUT_READY_ENDPOINTS
    };
    if let Some(value) = REFUSALS.get_ptr_mut(index) {
        // SAFETY: as in `count`.
        unsafe { *value += 1 };
    }
}

/// Whether a range of `frontend` (a frontend with `FRONTEND_FLAG_SOURCE_RANGES`)
/// holds `source`. A function of its own (a BPF-to-BPF call) so that its key
/// does not add to the stack frame of the ingress path that calls it.
#[inline(never)]
fn source_admitted(frontend: &FrontendKey, source: &[u8; 16]) -> bool {
    let key = LpmKey::new(
        SOURCE_RANGE_FRONTEND_BITS + 128,
        SourceRangeKey {
            frontend: *frontend,
            source_address: *source,
        },
    );
    SOURCE_RANGES.get(&key).is_some()
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

/// Whether `port_big_endian` is marked in `role` of the port filter.
#[inline(always)]
fn port_marked(role: u32, port_big_endian: u16) -> bool {
    matches!(
        PORT_FILTER.get(port_filter::index(role, port_big_endian)),
        Some(&port_filter::MARKED)
    )
}

/// Whether a packet at ingress may belong to a Switchyard flow: it goes to a
/// frontend port (a new flow or a client-direction packet), or to the hairpin
/// address (the reply of a hairpin flow, which ingress translates). Every other
/// entry ingress could find is a plain reply, which it passes on anyway.
#[inline(always)]
fn may_be_translated_at_ingress(packet: &Packet, config: &DatapathConfig) -> bool {
    let hairpin = &config.hairpin_address;
    port_marked(port_filter::FRONTEND_PORTS, packet.destination_port)
        || packet.destination_ipv4 == [hairpin[12], hairpin[13], hairpin[14], hairpin[15]]
}

/// Where `choose_backend` works: its affinity key and entry, and the result.
/// TC ingress keeps it in its per-CPU scratch slot, the socket hooks on their
/// stack (they run in process context, where a slot could be shared).
pub struct BackendChoice<'a> {
    pub affinity_key: &'a mut AffinityKey,
    pub affinity: &'a mut AffinityValue,
    pub backend: &'a mut BackendValue,
}

/// Chooses the backend of a new flow from `client` to `frontend` into
/// `choice.backend`: the client's affinity entry if the frontend has session
/// affinity and that entry is fresh and its slot still holds the same backend,
/// otherwise a uniformly random slot. `false` if there is none.
#[inline(always)]
fn choose_backend(
    frontend: &FrontendValue,
    client: &[u8; 16],
    now: u64,
    choice: BackendChoice<'_>,
) -> bool {
    let count = frontend.backend_count;
    if count == 0 {
        return false;
    }
    *choice.affinity_key = AffinityKey {
        client_address: *client,
        group_id: frontend.group_id,
    };
    let with_affinity = frontend.flags & FRONTEND_FLAG_SESSION_AFFINITY != 0;
    if with_affinity {
        // SAFETY: the value is copied out at once; a concurrent update can at worst
        // give a stale choice, which the slot check below catches.
        if let Some(entry) = unsafe { AFFINITY.get(&*choice.affinity_key) } {
            *choice.affinity = *entry;
            let timeout = frontend.affinity_timeout_seconds as u64 * 1_000_000_000;
            let ordinal = choice.affinity.ordinal;
            if ordinal < count && now.wrapping_sub(choice.affinity.last_used_nanoseconds) < timeout
            {
                let slot_key = BackendSlotKey {
                    group_id: frontend.group_id,
                    ordinal,
                };
                if let Some(slot) = unsafe { BACKEND_SLOTS.get(&slot_key) } {
                    if slot.address == choice.affinity.backend_address
                        && slot.port_big_endian == choice.affinity.backend_port_big_endian
                    {
                        *choice.backend = *slot;
                        remember_affinity(choice, ordinal, now);
                        return true;
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
    // SAFETY: copied out at once.
    let Some(slot) = (unsafe { BACKEND_SLOTS.get(&slot_key) }) else {
        return false;
    };
    *choice.backend = *slot;
    if with_affinity {
        remember_affinity(choice, ordinal, now);
    }
    true
}

#[inline(always)]
fn remember_affinity(choice: BackendChoice<'_>, ordinal: u32, now: u64) {
    *choice.affinity = AffinityValue {
        backend_address: choice.backend.address,
        backend_port_big_endian: choice.backend.port_big_endian,
        reserved: 0,
        ordinal,
        last_used_nanoseconds: now,
    };
    // A full LRU map evicts its oldest entry; a failure only costs affinity.
    let _ = AFFINITY.insert(&*choice.affinity_key, &*choice.affinity, 0);
}

#[inline(always)]
fn try_ingress(ctx: &TcContext, scope: u8) -> Result<i32, ()> {
    let Some(packet) = Packet::parse(ctx, FRAGMENT_SEEN_AT_INGRESS) else {
        // Not TCP or UDP: maybe an ICMP error about a reply, for a backend, or
        // a hairpin flow's error, sent straight back to its pod.
        return match icmp::translate_error(ctx, icmp::Direction::ToBackend) {
            icmp::BOUNCE => bounce(ctx),
            action => Ok(action),
        };
    };
    let Some(config) = config() else {
        return Ok(PASS);
    };
    if !may_be_translated_at_ingress(&packet, config) {
        return Ok(PASS);
    }
    // SAFETY: helper without arguments.
    let now = unsafe { bpf_ktime_get_ns() };
    let mut key_storage = MaybeUninit::uninit();
    let key = packet.write_conntrack_key(&mut key_storage);

    if let Some(entry) = conntrack::find_entry(key) {
        // SAFETY: the pointer is valid for this program run; fields are read and
        // written one at a time, which is what a shared map entry allows.
        let entry = unsafe { &mut *entry };
        let is_new_syn = packet.is_tcp_syn() && conntrack::is_closing(entry.tcp_state);
        // A UDP flow has no SYN to start it again: each datagram of a client-direction
        // entry checks that its reply entry is still its own (a DNS client's next
        // socket may get the same port, and its flow may have taken that entry over).
        // A later fragment follows its first, which made that check already.
        let reply_lost = packet.protocol == PROTOCOL_UDP
            && !packet.later_fragment
            && entry.flags & CONNTRACK_FLAG_REPLY == 0
            && !conntrack::reply_belongs_to(key, entry, config, now);
        if conntrack::is_live(entry, packet.protocol, config, now) && !is_new_syn && !reply_lost {
            return Ok(on_conntrack_hit(ctx, &packet, entry, config, now));
        }
    }
    if packet.later_fragment {
        // Only a first fragment opens a flow (or is refused): a later one
        // without a live flow has a first that was passed on as it was.
        return Ok(PASS);
    }
    match on_conntrack_miss(ctx, &packet, config, scope, now) {
        // Refused from here rather than from inside: `refuse` and
        // `on_conntrack_miss` then never add up on the stack.
        REFUSE => Ok(refuse(ctx, &packet)),
        action => Ok(action),
    }
}

/// What `on_conntrack_miss` returns for a new flow to a frontend without
/// backends (no TC action has this value): the caller answers it with `refuse`.
const REFUSE: i32 = i32::MIN;

// The two halves of ingress are functions of their own (BPF-to-BPF calls), so
// their stack frames do not add up against the verifier's 512-byte limit for the
// whole call chain. They return the action itself: a `Result` would be passed
// through a sixth argument, on the stack, which BPF calls cannot do.

/// A packet of a live flow: its entry's rewrite.
#[inline(never)]
fn on_conntrack_hit(
    ctx: &TcContext,
    packet: &Packet,
    entry: &mut ConntrackValue,
    config: &DatapathConfig,
    now: u64,
) -> i32 {
    let mut key_storage = MaybeUninit::uninit();
    let key = packet.write_conntrack_key(&mut key_storage);
    conntrack::apply_at_ingress(ctx, packet, key, entry, config.masquerade_mark, now)
        .unwrap_or_else(|()| count_error())
}

/// A packet without a live flow: a new flow if it goes to a frontend.
#[inline(never)]
fn on_conntrack_miss(
    ctx: &TcContext,
    packet: &Packet,
    config: &DatapathConfig,
    scope: u8,
    now: u64,
) -> i32 {
    try_conntrack_miss(ctx, packet, config, scope, now).unwrap_or_else(|()| count_error())
}

#[inline(always)]
fn try_conntrack_miss(
    ctx: &TcContext,
    packet: &Packet,
    config: &DatapathConfig,
    scope: u8,
    now: u64,
) -> Result<i32, ()> {
    // A new flow's keys and entries are built in a per-CPU scratch slot rather
    // than on the stack, which the call chain of ingress would otherwise outgrow.
    let flow = SCRATCH.get_ptr_mut(0).ok_or(())?;
    // SAFETY: this CPU's slot; ingress programs do not nest on one CPU.
    let flow = unsafe { &mut *flow };
    flow.frontend_key = FrontendKey {
        address: packet.destination_address(),
        port_big_endian: packet.destination_port,
        protocol: packet.protocol,
        scope,
    };
    // SAFETY: copied out at once.
    let Some(frontend) = (unsafe { FRONTENDS.get(&flow.frontend_key) }) else {
        return Ok(PASS);
    };
    flow.frontend = *frontend;
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
    // SAFETY: `MaybeUninit<T>` has the layout of `T`; every byte gets written.
    packet.write_conntrack_key(unsafe {
        &mut *(&mut flow.key as *mut ConntrackKey).cast::<MaybeUninit<ConntrackKey>>()
    });
    // loadBalancerSourceRanges, at new-flow time only (kube-proxy filters
    // connections in state NEW: a flow admitted before the ranges changed goes on).
    // Before the refusal of a Service without endpoints: kube-proxy's nftables
    // mode drops such a source before any rejection, and a refusal would tell a
    // filtered client that the address exists.
    if flow.frontend.flags & FRONTEND_FLAG_SOURCE_RANGES != 0
        && !source_admitted(&flow.frontend_key, &flow.key.source_address)
    {
        count_source_range_drop();
        return Ok(TC_ACT_SHOT);
    }
    if flow.frontend.backend_count == 0 {
        count_refusal(&flow.frontend);
        if flow.frontend.flags & FRONTEND_FLAG_DROP_WITHOUT_BACKENDS != 0 {
            return Ok(TC_ACT_SHOT);
        }
        return Ok(REFUSE);
    }
    open_flow(ctx, packet, flow, config, now)
}

/// Answers a packet to a frontend without backends with ICMP port unreachable.
// Not inlined: see `on_conntrack_hit`.
#[inline(never)]
fn refuse(ctx: &TcContext, packet: &Packet) -> i32 {
    packet::reject_with_icmp_port_unreachable(ctx, packet).unwrap_or_else(|()| count_error())
}

/// A new flow (`flow.key` to `flow.frontend`): chooses its backend (and, if
/// needed, a source port), writes both conntrack entries, translates the packet.
#[inline(always)]
fn open_flow(
    ctx: &TcContext,
    packet: &Packet,
    flow: &mut NewFlow,
    config: &DatapathConfig,
    now: u64,
) -> Result<i32, ()> {
    let chosen = choose_backend(
        &flow.frontend,
        &flow.key.source_address,
        now,
        BackendChoice {
            affinity_key: &mut flow.affinity_key,
            affinity: &mut flow.affinity,
            backend: &mut flow.backend,
        },
    );
    if !chosen {
        return Err(());
    }
    let hairpin = flow.backend.address == flow.key.source_address;
    let masquerade = flow.frontend.flags & FRONTEND_FLAG_MASQUERADE_REMOTE != 0
        && flow.frontend.flags & FRONTEND_FLAG_PRESERVE_CLIENT_ADDRESS == 0
        && flow.backend.flags & BACKEND_FLAG_LOCAL == 0
        && config.masquerade_mark != 0;
    // The address the backend sees as the client, and answers to.
    flow.reply_key = ConntrackKey {
        source_address: flow.backend.address,
        destination_address: if hairpin {
            config.hairpin_address
        } else {
            flow.key.source_address
        },
        source_port_big_endian: flow.backend.port_big_endian,
        destination_port_big_endian: packet.source_port,
        protocol: packet.protocol,
        reserved: [0; 3],
    };
    // Another live flow from this client port may already reach this backend
    // through another frontend: the backend could not tell the two apart, and
    // one reply entry cannot translate back to both. Give the new flow another
    // source port, as netfilter's NAT does when a tuple is taken.
    let mut port_translated = false;
    if !hairpin && conntrack::held_by_another_flow(&flow.reply_key, &flow.key, config, now) {
        for _ in 0..PORT_TRANSLATION_ATTEMPTS {
            // SAFETY: helper without arguments.
            let random = unsafe { bpf_get_prandom_u32() };
            let candidate =
                (FIRST_TRANSLATED_PORT + random % (65_536 - FIRST_TRANSLATED_PORT)) as u16;
            flow.reply_key.destination_port_big_endian = candidate.to_be();
            if !conntrack::held_by_another_flow(&flow.reply_key, &flow.key, config, now) {
                port_translated = true;
                break;
            }
        }
        if !port_translated {
            // Every port tried is held too: take the tuple over (the older flow
            // chooses again on its next datagram; a TCP one may break).
            flow.reply_key.destination_port_big_endian = packet.source_port;
        }
    }

    let mut reply_flags = CONNTRACK_FLAG_REPLY | CONNTRACK_FLAG_REWRITE_SOURCE;
    // Every new client-direction entry says that its reply entry records the
    // backend's first packet (`refresh`), unlike entries of older programs.
    let mut forward_flags = CONNTRACK_FLAG_REWRITE_DESTINATION | CONNTRACK_FLAG_RECORDS_REPLY;
    if hairpin {
        reply_flags |= CONNTRACK_FLAG_REWRITE_DESTINATION;
        forward_flags |= CONNTRACK_FLAG_REWRITE_SOURCE;
    }
    if port_translated {
        reply_flags |= CONNTRACK_FLAG_REWRITE_DESTINATION | CONNTRACK_FLAG_PORT_TRANSLATED;
        forward_flags |= CONNTRACK_FLAG_REWRITE_SOURCE | CONNTRACK_FLAG_PORT_TRANSLATED;
    }
    if masquerade {
        forward_flags |= CONNTRACK_FLAG_MASQUERADE;
    }
    flow.reply = ConntrackValue {
        new_source_address: flow.key.destination_address,
        new_destination_address: flow.key.source_address,
        new_source_port_big_endian: packet.destination_port,
        new_destination_port_big_endian: packet.source_port,
        flags: reply_flags,
        tcp_state: 0,
        reserved: [0; 2],
        last_seen_nanoseconds: now,
    };
    flow.forward = ConntrackValue {
        new_source_address: flow.reply_key.destination_address,
        new_destination_address: flow.backend.address,
        new_source_port_big_endian: flow.reply_key.destination_port_big_endian,
        new_destination_port_big_endian: flow.backend.port_big_endian,
        flags: forward_flags,
        tcp_state: 0,
        reserved: [0; 2],
        last_seen_nanoseconds: now,
    };
    // Reply entry first: a reply can never arrive before the packet it answers has
    // been sent on, and that happens only after both writes.
    conntrack::insert(&flow.reply_key, &flow.reply)?;
    conntrack::insert(&flow.key, &flow.forward)?;
    count(counter::TRANSLATED);
    conntrack::rewrite_forward(ctx, packet, &flow.forward, config.masquerade_mark)
}

fn try_egress(ctx: &TcContext) -> Result<i32, ()> {
    let Some(packet) = Packet::parse(ctx, FRAGMENT_SEEN_AT_EGRESS) else {
        // Not TCP or UDP: maybe an ICMP error for a client.
        return Ok(icmp::translate_error(ctx, icmp::Direction::ToClient));
    };
    // Egress translates replies only, and a reply comes from a backend's port.
    if !port_marked(port_filter::BACKEND_PORTS, packet.source_port) {
        return Ok(PASS);
    }
    let mut key_storage = MaybeUninit::uninit();
    let key = packet.write_conntrack_key(&mut key_storage);
    let Some(entry) = conntrack::find_entry(key) else {
        return Ok(PASS);
    };
    let Some(config) = config() else {
        return Ok(PASS);
    };
    // SAFETY: see try_ingress.
    let entry = unsafe { &mut *entry };
    // Only plain and port-translated replies are translated here; hairpin replies
    // never reach egress untranslated (ingress sends them straight back out).
    if entry.flags & CONNTRACK_FLAG_REPLY == 0
        || (entry.flags & CONNTRACK_FLAG_REWRITE_DESTINATION != 0 && conntrack::is_hairpin(entry))
    {
        return Ok(PASS);
    }
    if packet.is_tcp_syn_ack() && conntrack::is_closing(entry.tcp_state) {
        // A backend accepting a new connection on the tuple of a flow that has
        // closed: a connection to the pod IP itself (an application's, or one the
        // connect hook pointed there) from the client port the closed flow used.
        // It is not ours; translating it would turn its answers into the closed
        // flow's, and every answer would keep the closed entry alive. Forget the
        // closed flow, so the rest of the new connection passes untouched too.
        entry.last_seen_nanoseconds = 0;
        return Ok(PASS);
    }
    let now = unsafe { bpf_ktime_get_ns() };
    if !conntrack::is_live(entry, packet.protocol, config, now) {
        return Ok(PASS);
    }
    conntrack::refresh(entry, &packet, key, now);
    count(counter::REVERSE_TRANSLATED);
    let rewrite = *entry;
    packet::rewrite_source(
        ctx,
        &packet,
        rewrite.new_source_address,
        rewrite.new_source_port_big_endian,
    )?;
    if rewrite.flags & CONNTRACK_FLAG_PORT_TRANSLATED != 0 {
        // Back to the port the client sent from.
        packet::rewrite_destination(
            ctx,
            &packet,
            rewrite.new_destination_address,
            rewrite.new_destination_port_big_endian,
        )?;
    }
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
