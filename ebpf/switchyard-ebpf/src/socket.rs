//! cgroup socket hooks: Services translated once at connect/sendmsg time
//! instead of per packet.
//!
//! The hooks sit on a cgroup, which every network namespace on the machine
//! shares, so they tell the node's own namespace (by the cookie the agent
//! configured) from every other one (pods):
//! - the node's processes (host network namespace, hostNetwork pods): TCP and
//!   UDP, with the node as the client for session affinity; this is also how
//!   localhost NodePorts (127.0.0.1, internal-scope frontends) are served, as
//!   loopback traffic never reaches the TC programs;
//! - pods, when `pod_connect_balancing` asks for it: TCP connects only, of
//!   sockets not bound to a source port, and only to frontends the TC programs
//!   would translate the same way (no session affinity, no masquerading, some
//!   backend). Everything else, UDP included (a connected UDP socket would keep
//!   a backend that has gone), stays with the TC programs, so it behaves exactly
//!   as without the hook.
//!
//! IPv6 (`connect6`, `sendmsg6`, `recvmsg6`, `getpeername6`; attached only
//! when the agent serves IPv6): the same translation on 16-byte addresses, read
//! and written through `user_ip6`. An IPv4-mapped destination on an IPv6 socket
//! (`::ffff:10.96.0.10`) is the IPv4 Service it names: the map keys hold IPv4
//! addresses in that very form, so it finds the IPv4 frontend, and the backend
//! (IPv4, of the same group) is written back IPv4-mapped; the kernel then speaks
//! IPv4 on the socket. Pods' IPv6 sockets are translated only for such IPv4
//! Services: the TC programs do not translate IPv6 yet, and a pod's IPv6 TCP
//! translated here while its UDP is not would be half a Service.
//!
//! Return values: 1 lets the call proceed, 0 fails it with EPERM (used to refuse
//! a Service without endpoints at once, for the node's processes, and a
//! load-balancer address whose source ranges leave the node's addresses out).
//!
//! A translated socket's reverse entry (backend -> Service, for getpeername and
//! UDP answers) is removed when the socket is released, so the LRU holds the
//! entries of open sockets rather than of the last 65,536 connects: a long-lived
//! connection keeps its peer name however many short ones come after it, and an
//! insert seldom has to evict. Entries the release cannot find by the socket's
//! peer still age out of the LRU: those of unconnected UDP sockets (which send
//! to many peers), of a connected socket's `sendto` elsewhere, of a connect that
//! failed at once, and of a socket disconnected or connected again.

use aya_ebpf::{
    helpers::{bpf_get_netns_cookie, bpf_get_socket_cookie, bpf_ktime_get_ns},
    programs::{SockAddrContext, SockContext},
    EbpfContext,
};
use switchyard_common::{
    counter, ipv4_mapped, port_filter, Address, AffinityKey, AffinityValue, BackendValue,
    DatapathConfig, FrontendKey, FrontendValue, SocketReverseKey, SocketReverseValue,
    DATAPATH_MODE_ACTIVE, FRONTEND_FLAG_MASQUERADE_REMOTE,
    FRONTEND_FLAG_NODE_OUTSIDE_SOURCE_RANGES, FRONTEND_FLAG_NO_POD_CONNECT_BALANCING,
    FRONTEND_FLAG_SESSION_AFFINITY, FRONTEND_FLAG_SOURCE_RANGES, POD_CONNECT_BALANCING_TCP,
    PROTOCOL_TCP, PROTOCOL_UDP, SCOPE_INTERNAL,
};

use crate::{
    choose_backend, config, count, count_refusal, count_source_range_drop, port_marked,
    BackendChoice, FRONTENDS, SOCKET_REVERSE,
};

const ALLOW: i32 = 1;
const REFUSE: i32 = 0;
const ADDRESS_FAMILY_INET: u32 = 2;
const ADDRESS_FAMILY_INET6: u32 = 10;
const SOCKET_TYPE_DATAGRAM: u32 = 2;
/// 127.0.0.0/8.
const LOOPBACK_FIRST_OCTET: u8 = 127;

/// Which family's hook runs: their address fields differ (`user_ip4` or
/// `user_ip6`; a hook may touch only its own family's). Always a constant where
/// the inlined functions below branch on it, so each program keeps one branch.
#[derive(Clone, Copy, PartialEq, Eq)]
enum HookFamily {
    Ipv4,
    Ipv6,
}

/// `::ffff:0:0/96` as the third 32-bit word of an address, in memory order.
const IPV4_MAPPED_WORD: u32 = u32::from_ne_bytes([0, 0, 0xff, 0xff]);

/// The context's user address in the maps' 16-byte form, and whether it is
/// IPv4 (always for the IPv4 hooks; IPv4-mapped for the IPv6 ones), or `None`
/// when the address is not of the hook's family.
#[inline(always)]
fn user_address(ctx: &SockAddrContext, hook: HookFamily) -> Option<(Address, bool)> {
    let address = ctx.sock_addr;
    // SAFETY: 4-byte reads of context fields the hook's family may read, as the
    // verifier requires; `user_ip4`/`user_ip6` hold network byte order in memory.
    unsafe {
        let family = core::ptr::read_volatile(&(*address).user_family);
        match hook {
            HookFamily::Ipv4 => {
                if family != ADDRESS_FAMILY_INET {
                    return None;
                }
                let ipv4 = core::ptr::read_volatile(&(*address).user_ip4);
                Some((ipv4_mapped(ipv4.to_ne_bytes()), true))
            }
            HookFamily::Ipv6 => {
                if family != ADDRESS_FAMILY_INET6 {
                    return None;
                }
                let words = [
                    core::ptr::read_volatile(&(*address).user_ip6[0]),
                    core::ptr::read_volatile(&(*address).user_ip6[1]),
                    core::ptr::read_volatile(&(*address).user_ip6[2]),
                    core::ptr::read_volatile(&(*address).user_ip6[3]),
                ];
                let mapped = words[0] == 0 && words[1] == 0 && words[2] == IPV4_MAPPED_WORD;
                Some((words_to_address(words), mapped))
            }
        }
    }
}

#[inline(always)]
fn words_to_address(words: [u32; 4]) -> Address {
    let [a, b, c, d] = words.map(u32::to_ne_bytes);
    [
        a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3], c[0], c[1], c[2], c[3], d[0], d[1], d[2],
        d[3],
    ]
}

#[inline(always)]
fn address_word(address: &Address, index: usize) -> u32 {
    u32::from_ne_bytes([
        address[4 * index],
        address[4 * index + 1],
        address[4 * index + 2],
        address[4 * index + 3],
    ])
}

/// Writes `address` (16-byte form) and `port_big_endian` as the context's user
/// address: the last four bytes into `user_ip4` for the IPv4 hooks, all sixteen
/// into `user_ip6` (an IPv4 address IPv4-mapped) for the IPv6 ones.
#[inline(always)]
fn write_user_address(
    ctx: &SockAddrContext,
    hook: HookFamily,
    address: &Address,
    port_big_endian: u16,
) {
    let context = ctx.sock_addr;
    // SAFETY: 4-byte writes of the fields these hooks may change.
    unsafe {
        match hook {
            HookFamily::Ipv4 => {
                core::ptr::write_volatile(&mut (*context).user_ip4, address_word(address, 3));
            }
            HookFamily::Ipv6 => {
                core::ptr::write_volatile(&mut (*context).user_ip6[0], address_word(address, 0));
                core::ptr::write_volatile(&mut (*context).user_ip6[1], address_word(address, 1));
                core::ptr::write_volatile(&mut (*context).user_ip6[2], address_word(address, 2));
                core::ptr::write_volatile(&mut (*context).user_ip6[3], address_word(address, 3));
            }
        }
        core::ptr::write_volatile(&mut (*context).user_port, port_big_endian as u32);
    }
}

/// Whose socket a hook is looking at.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Owner {
    /// A process in the node's network namespace.
    Node,
    /// A process in any other network namespace: a pod.
    Pod,
}

/// The configuration and the owner of this socket, if the hooks act on it: the
/// node's sockets always, pods' only when connect-time translation is on for them.
#[inline(always)]
fn config_for_this_socket(ctx: &SockAddrContext) -> Option<(&'static DatapathConfig, Owner)> {
    let config = config()?;
    if config.network_namespace_cookie == 0 {
        // Not configured yet: no namespace can be told from another.
        return None;
    }
    // SAFETY: helper on the context the kernel passed in.
    let cookie = unsafe { bpf_get_netns_cookie(ctx.as_ptr()) };
    if cookie == config.network_namespace_cookie {
        Some((config, Owner::Node))
    } else if config.pod_connect_balancing == POD_CONNECT_BALANCING_TCP {
        Some((config, Owner::Pod))
    } else {
        None
    }
}

/// Whether the socket was bound to a source port before it connected. Such a
/// socket keeps that port whatever its destination, so two of them connecting
/// from one port to two Services that pick the same backend would ask for the
/// same tuple and the second connect would fail; the TC programs give the
/// second flow another source port instead (as netfilter's NAT does). Unbound
/// sockets get their port after this hook, unique for the backend.
#[inline(always)]
fn has_source_port(ctx: &SockAddrContext) -> bool {
    // SAFETY: `sk` of a sock_addr context is a valid socket for the program's
    // run; both are plain loads the verifier checks.
    unsafe {
        let socket = core::ptr::read_volatile(&(*ctx.sock_addr).__bindgen_anon_1.sk);
        core::ptr::read_volatile(&(*socket).src_port) != 0
    }
}

/// Whether a pod's connect to `frontend` is translated here rather than by TC:
/// only where the result is the same. Session affinity is keyed by the client's
/// address, which a socket has not got before it connects; masquerading and the
/// ICMP refusal of a Service without endpoints happen per packet, and so does
/// the source ranges' check, which needs the pod's source address; and an
/// address whose backends depend on where the client enters the node
/// (`FRONTEND_FLAG_NO_POD_CONNECT_BALANCING`) stays with TC, which sees that.
#[inline(always)]
fn pod_connect_translated_here(frontend: &FrontendValue) -> bool {
    frontend.backend_count != 0
        && frontend.flags
            & (FRONTEND_FLAG_SESSION_AFFINITY
                | FRONTEND_FLAG_MASQUERADE_REMOTE
                | FRONTEND_FLAG_SOURCE_RANGES
                | FRONTEND_FLAG_NO_POD_CONNECT_BALANCING)
            == 0
}

pub fn try_connect4(ctx: &SockAddrContext) -> i32 {
    translate(ctx, HookFamily::Ipv4)
}

pub fn try_connect6(ctx: &SockAddrContext) -> i32 {
    translate(ctx, HookFamily::Ipv6)
}

pub fn try_sendmsg4(ctx: &SockAddrContext) -> i32 {
    sendmsg(ctx, HookFamily::Ipv4)
}

pub fn try_sendmsg6(ctx: &SockAddrContext) -> i32 {
    sendmsg(ctx, HookFamily::Ipv6)
}

#[inline(always)]
fn sendmsg(ctx: &SockAddrContext, hook: HookFamily) -> i32 {
    // SAFETY: reading a field of the kernel's context.
    let socket_type = unsafe { core::ptr::read_volatile(&(*ctx.sock_addr).type_) };
    if socket_type != SOCKET_TYPE_DATAGRAM {
        return ALLOW;
    }
    translate(ctx, hook)
}

#[inline(always)]
fn translate(ctx: &SockAddrContext, hook: HookFamily) -> i32 {
    let Some((config, owner)) = config_for_this_socket(ctx) else {
        return ALLOW;
    };
    if config.mode != DATAPATH_MODE_ACTIVE {
        return ALLOW;
    }
    let address = ctx.sock_addr;
    let Some((frontend_address, ipv4)) = user_address(ctx, hook) else {
        return ALLOW;
    };
    // SAFETY: 4-byte reads of context fields, as the verifier requires.
    let (protocol, port) = unsafe {
        (
            core::ptr::read_volatile(&(*address).protocol),
            core::ptr::read_volatile(&(*address).user_port),
        )
    };
    let protocol = protocol as u8;
    let wanted = match owner {
        Owner::Node => protocol == PROTOCOL_TCP || protocol == PROTOCOL_UDP,
        Owner::Pod => protocol == PROTOCOL_TCP,
    };
    if !wanted {
        return ALLOW;
    }
    // A pod's loopback is its own: 127.0.0.1 is a Service address (a localhost
    // NodePort) for the node's processes only, as with kube-proxy, whose rules
    // never see a pod's loopback traffic. Pods' IPv6 Services stay untranslated
    // (see the module documentation).
    if owner == Owner::Pod
        && ((hook == HookFamily::Ipv6 && !ipv4) || frontend_address[12] == LOOPBACK_FIRST_OCTET)
    {
        return ALLOW;
    }
    // `user_port` holds network byte order in memory.
    let frontend_port = port as u16;
    let key = FrontendKey {
        address: frontend_address,
        port_big_endian: frontend_port,
        protocol,
        scope: SCOPE_INTERNAL,
    };
    // SAFETY: copied out at once.
    let Some(frontend) = (unsafe { FRONTENDS.get(&key) }).copied() else {
        return ALLOW;
    };
    if owner == Owner::Pod && (!pod_connect_translated_here(&frontend) || has_source_port(ctx)) {
        return ALLOW;
    }
    // The node's own processes and loadBalancerSourceRanges: the agent decided
    // from the node's addresses (a socket has no source address yet).
    if frontend.flags & FRONTEND_FLAG_NODE_OUTSIDE_SOURCE_RANGES != 0 {
        count_source_range_drop();
        return REFUSE;
    }
    if frontend.backend_count == 0 {
        count_refusal(&frontend);
        return REFUSE;
    }
    // Host processes have no source address yet at connect time: for session
    // affinity they count as one client, the node (as with kube-proxy, where they
    // usually leave with the node's address). Pods get here only for frontends
    // without affinity.
    let now = unsafe { bpf_ktime_get_ns() };
    let mut affinity_key = AffinityKey {
        client_address: [0; 16],
        group_id: 0,
    };
    let mut affinity = AffinityValue {
        backend_address: [0; 16],
        backend_port_big_endian: 0,
        reserved: 0,
        ordinal: 0,
        last_used_nanoseconds: 0,
    };
    let mut backend = BackendValue {
        address: [0; 16],
        port_big_endian: 0,
        flags: 0,
    };
    let choice = BackendChoice {
        affinity_key: &mut affinity_key,
        affinity: &mut affinity,
        backend: &mut backend,
    };
    if !choose_backend(&frontend, &[0; 16], now, choice) {
        count(counter::ERROR);
        return ALLOW;
    }
    // The backend is of the frontend's family (a group holds one family's
    // endpoints): IPv4 for an IPv4 frontend, written IPv4-mapped by an IPv6 hook.
    write_user_address(ctx, hook, &backend.address, backend.port_big_endian);
    let reverse_key = SocketReverseKey {
        // SAFETY: helper on the context the kernel passed in.
        socket_cookie: unsafe { bpf_get_socket_cookie(ctx.as_ptr()) },
        backend_address: backend.address,
        backend_port_big_endian: backend.port_big_endian,
        reserved: [0; 6],
    };
    let reverse = SocketReverseValue {
        frontend_address,
        frontend_port_big_endian: frontend_port,
        reserved: 0,
    };
    if SOCKET_REVERSE.insert(&reverse_key, &reverse, 0).is_err() {
        count(counter::ERROR);
    }
    count(counter::TRANSLATED);
    ALLOW
}

/// `recvmsg4`: a UDP answer shows the Service address the node's process sent
/// to instead of the backend (pods' UDP is never translated here).
pub fn try_reverse_datagram(ctx: &SockAddrContext) -> i32 {
    reverse_datagram(ctx, HookFamily::Ipv4)
}

/// `recvmsg6`: as `recvmsg4`, for IPv6 sockets (an answer from an IPv4 backend
/// of an IPv4-mapped Service arrives IPv4-mapped).
pub fn try_reverse_datagram6(ctx: &SockAddrContext) -> i32 {
    reverse_datagram(ctx, HookFamily::Ipv6)
}

#[inline(always)]
fn reverse_datagram(ctx: &SockAddrContext, hook: HookFamily) -> i32 {
    match config_for_this_socket(ctx) {
        Some((_, Owner::Node)) => reverse(ctx, hook),
        _ => ALLOW,
    }
}

/// `getpeername4`: the application sees the Service address it connected to
/// instead of the backend it was sent to.
pub fn try_reverse_peer_name(ctx: &SockAddrContext) -> i32 {
    reverse_peer_name(ctx, HookFamily::Ipv4)
}

/// `getpeername6`: as `getpeername4`, for IPv6 sockets.
pub fn try_reverse_peer_name6(ctx: &SockAddrContext) -> i32 {
    reverse_peer_name(ctx, HookFamily::Ipv6)
}

#[inline(always)]
fn reverse_peer_name(ctx: &SockAddrContext, hook: HookFamily) -> i32 {
    match config_for_this_socket(ctx) {
        Some(_) => reverse(ctx, hook),
        None => ALLOW,
    }
}

#[inline(always)]
fn reverse(ctx: &SockAddrContext, hook: HookFamily) -> i32 {
    let address = ctx.sock_addr;
    // SAFETY: a 4-byte read of a context field.
    let port = unsafe { core::ptr::read_volatile(&(*address).user_port) };
    // A translated socket's peer is a backend, whose port the port filter has
    // marked (before the backend was written, and again from the reverse
    // entries whenever a load builds a new filter): a server's accepted
    // socket, whose peer port is a client's, is let through before any hash is
    // touched. Servers call this hook on every accept.
    if !port_marked(port_filter::BACKEND_PORTS, port as u16) {
        return ALLOW;
    }
    let Some((backend_address, _)) = user_address(ctx, hook) else {
        return ALLOW;
    };
    let key = SocketReverseKey {
        // SAFETY: helper on the context the kernel passed in.
        socket_cookie: unsafe { bpf_get_socket_cookie(ctx.as_ptr()) },
        backend_address,
        backend_port_big_endian: port as u16,
        reserved: [0; 6],
    };
    // SAFETY: copied out at once.
    let Some(reverse) = (unsafe { SOCKET_REVERSE.get(&key) }).copied() else {
        return ALLOW;
    };
    write_user_address(
        ctx,
        hook,
        &reverse.frontend_address,
        reverse.frontend_port_big_endian,
    );
    ALLOW
}

/// `sock_release`: removes the reverse entry of a socket the hooks translated,
/// found by the peer it is connected to (the backend). Sockets with no peer,
/// and sockets whose peer's port no backend uses, are skipped before the
/// reverse map is touched.
pub fn try_forget_peer(ctx: &SockContext) -> i32 {
    // Not gated on the configuration: a socket translated before pods'
    // connect-time balancing was switched off must still lose its entry.
    let socket = ctx.sock;
    // SAFETY: reads of fields every cgroup socket hook may read. All read up
    // front, unconditionally: a read inside a branch lets the compiler share an
    // offset pointer into the context between the branches, which the verifier
    // refuses ("dereference of modified ctx ptr").
    let (family, destination_port, destination_ipv4, destination_ipv6) = unsafe {
        (
            core::ptr::read_volatile(&(*socket).family),
            core::ptr::read_volatile(&(*socket).dst_port),
            core::ptr::read_volatile(&(*socket).dst_ip4),
            [
                core::ptr::read_volatile(&(*socket).dst_ip6[0]),
                core::ptr::read_volatile(&(*socket).dst_ip6[1]),
                core::ptr::read_volatile(&(*socket).dst_ip6[2]),
                core::ptr::read_volatile(&(*socket).dst_ip6[3]),
            ],
        )
    };
    // A translated socket's peer is a backend, whose port the port filter has
    // marked: sockets accepted by servers (their peer's port is a client's) and
    // most others are skipped before any hash is touched.
    if !port_marked(port_filter::BACKEND_PORTS, destination_port) {
        return ALLOW;
    }
    // `dst_ip4`, `dst_ip6` and `dst_port` hold network byte order in memory, as
    // the connect hooks' `user_ip4`, `user_ip6` and `user_port` did. An IPv6
    // socket connected to an IPv4-mapped Service holds the IPv4-mapped backend,
    // the reverse entry's very key; IPv6 sockets are looked at whether or not
    // the IPv6 hooks are attached, as `sendmsg4` translates their datagrams to
    // IPv4-mapped Services too.
    let backend_address = if family == ADDRESS_FAMILY_INET {
        ipv4_mapped(destination_ipv4.to_ne_bytes())
    } else if family == ADDRESS_FAMILY_INET6 {
        words_to_address(destination_ipv6)
    } else {
        return ALLOW;
    };
    // No peer: nothing was translated.
    if backend_address == [0; 16] || backend_address == ipv4_mapped([0; 4]) {
        return ALLOW;
    }
    let key = SocketReverseKey {
        // SAFETY: helper on the context the kernel passed in.
        socket_cookie: unsafe { bpf_get_socket_cookie(ctx.as_ptr()) },
        backend_address,
        backend_port_big_endian: destination_port,
        reserved: [0; 6],
    };
    // Absent (never translated, or evicted) is fine: nothing to remove.
    let _ = SOCKET_REVERSE.remove(&key);
    ALLOW
}
