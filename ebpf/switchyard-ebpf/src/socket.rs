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
    counter, ipv4_mapped, port_filter, AffinityKey, AffinityValue, BackendValue, DatapathConfig,
    FrontendKey, FrontendValue, SocketReverseKey, SocketReverseValue, DATAPATH_MODE_ACTIVE,
    FRONTEND_FLAG_MASQUERADE_REMOTE, FRONTEND_FLAG_NODE_OUTSIDE_SOURCE_RANGES,
    FRONTEND_FLAG_NO_POD_CONNECT_BALANCING, FRONTEND_FLAG_SESSION_AFFINITY,
    FRONTEND_FLAG_SOURCE_RANGES, POD_CONNECT_BALANCING_TCP, PROTOCOL_TCP, PROTOCOL_UDP,
    SCOPE_INTERNAL,
};

use crate::{
    choose_backend, config, count, count_refusal, count_source_range_drop, port_marked,
    BackendChoice, FRONTENDS, SOCKET_REVERSE,
};

const ALLOW: i32 = 1;
const REFUSE: i32 = 0;
const ADDRESS_FAMILY_INET: u32 = 2;
const SOCKET_TYPE_DATAGRAM: u32 = 2;
/// 127.0.0.0/8.
const LOOPBACK_FIRST_OCTET: u8 = 127;

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
    translate(ctx)
}

pub fn try_sendmsg4(ctx: &SockAddrContext) -> i32 {
    // SAFETY: reading a field of the kernel's context.
    let socket_type = unsafe { core::ptr::read_volatile(&(*ctx.sock_addr).type_) };
    if socket_type != SOCKET_TYPE_DATAGRAM {
        return ALLOW;
    }
    translate(ctx)
}

#[inline(always)]
fn translate(ctx: &SockAddrContext) -> i32 {
    let Some((config, owner)) = config_for_this_socket(ctx) else {
        return ALLOW;
    };
    if config.mode != DATAPATH_MODE_ACTIVE {
        return ALLOW;
    }
    let address = ctx.sock_addr;
    // SAFETY: 4-byte reads of context fields, as the verifier requires.
    let (family, protocol, ipv4, port) = unsafe {
        (
            core::ptr::read_volatile(&(*address).user_family),
            core::ptr::read_volatile(&(*address).protocol),
            core::ptr::read_volatile(&(*address).user_ip4),
            core::ptr::read_volatile(&(*address).user_port),
        )
    };
    if family != ADDRESS_FAMILY_INET {
        return ALLOW;
    }
    let protocol = protocol as u8;
    let wanted = match owner {
        Owner::Node => protocol == PROTOCOL_TCP || protocol == PROTOCOL_UDP,
        Owner::Pod => protocol == PROTOCOL_TCP,
    };
    if !wanted {
        return ALLOW;
    }
    // `user_ip4` and `user_port` hold network byte order in memory.
    let destination = ipv4.to_ne_bytes();
    // A pod's loopback is its own: 127.0.0.1 is a Service address (a localhost
    // NodePort) for the node's processes only, as with kube-proxy, whose rules
    // never see a pod's loopback traffic.
    if owner == Owner::Pod && destination[0] == LOOPBACK_FIRST_OCTET {
        return ALLOW;
    }
    let frontend_address = ipv4_mapped(destination);
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
    let backend_ipv4 = [
        backend.address[12],
        backend.address[13],
        backend.address[14],
        backend.address[15],
    ];
    // SAFETY: 4-byte writes of the fields this hook may change.
    unsafe {
        core::ptr::write_volatile(&mut (*address).user_ip4, u32::from_ne_bytes(backend_ipv4));
        core::ptr::write_volatile(&mut (*address).user_port, backend.port_big_endian as u32);
    }
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
    match config_for_this_socket(ctx) {
        Some((_, Owner::Node)) => reverse(ctx),
        _ => ALLOW,
    }
}

/// `getpeername4`: the application sees the Service address it connected to
/// instead of the backend it was sent to.
pub fn try_reverse_peer_name(ctx: &SockAddrContext) -> i32 {
    match config_for_this_socket(ctx) {
        Some(_) => reverse(ctx),
        None => ALLOW,
    }
}

#[inline(always)]
fn reverse(ctx: &SockAddrContext) -> i32 {
    let address = ctx.sock_addr;
    // SAFETY: 4-byte reads of context fields.
    let (family, ipv4, port) = unsafe {
        (
            core::ptr::read_volatile(&(*address).user_family),
            core::ptr::read_volatile(&(*address).user_ip4),
            core::ptr::read_volatile(&(*address).user_port),
        )
    };
    // A translated socket's peer is a backend, whose port the port filter has
    // marked (before the backend was written, and again from the reverse
    // entries whenever a load builds a new filter): a server's accepted
    // socket, whose peer port is a client's, is let through before any hash is
    // touched. Servers call this hook on every accept.
    if family != ADDRESS_FAMILY_INET || !port_marked(port_filter::BACKEND_PORTS, port as u16) {
        return ALLOW;
    }
    let key = SocketReverseKey {
        // SAFETY: helper on the context the kernel passed in.
        socket_cookie: unsafe { bpf_get_socket_cookie(ctx.as_ptr()) },
        backend_address: ipv4_mapped(ipv4.to_ne_bytes()),
        backend_port_big_endian: port as u16,
        reserved: [0; 6],
    };
    // SAFETY: copied out at once.
    let Some(reverse) = (unsafe { SOCKET_REVERSE.get(&key) }).copied() else {
        return ALLOW;
    };
    let frontend_ipv4 = [
        reverse.frontend_address[12],
        reverse.frontend_address[13],
        reverse.frontend_address[14],
        reverse.frontend_address[15],
    ];
    // SAFETY: 4-byte writes of the fields this hook may change.
    unsafe {
        core::ptr::write_volatile(&mut (*address).user_ip4, u32::from_ne_bytes(frontend_ipv4));
        core::ptr::write_volatile(
            &mut (*address).user_port,
            reverse.frontend_port_big_endian as u32,
        );
    }
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
    // SAFETY: reads of fields every cgroup socket hook may read.
    let (family, destination_ipv4, destination_port) = unsafe {
        (
            core::ptr::read_volatile(&(*socket).family),
            core::ptr::read_volatile(&(*socket).dst_ip4),
            core::ptr::read_volatile(&(*socket).dst_port),
        )
    };
    // A translated socket's peer is a backend, whose port the port filter has
    // marked: sockets accepted by servers (their peer's port is a client's) and
    // most others are skipped before any hash is touched.
    if family != ADDRESS_FAMILY_INET
        || destination_ipv4 == 0
        || !port_marked(port_filter::BACKEND_PORTS, destination_port)
    {
        return ALLOW;
    }
    let key = SocketReverseKey {
        // SAFETY: helper on the context the kernel passed in.
        socket_cookie: unsafe { bpf_get_socket_cookie(ctx.as_ptr()) },
        // `dst_ip4` and `dst_port` hold network byte order in memory, as the
        // connect hook's `user_ip4` and `user_port` did.
        backend_address: ipv4_mapped(destination_ipv4.to_ne_bytes()),
        backend_port_big_endian: destination_port,
        reserved: [0; 6],
    };
    // Absent (never translated, or evicted) is fine: nothing to remove.
    let _ = SOCKET_REVERSE.remove(&key);
    ALLOW
}
