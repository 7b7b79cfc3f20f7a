//! cgroup socket hooks: Services for the node's own processes (host network
//! namespace), translated once at connect/sendmsg time instead of per packet.
//!
//! The hooks sit on a cgroup, which every network namespace on the machine shares,
//! so they act only on sockets of the namespace whose cookie the agent configured.
//! Return values: 1 lets the call proceed, 0 fails it with EPERM (used to refuse a
//! Service without endpoints at once).

use aya_ebpf::{
    helpers::{bpf_get_netns_cookie, bpf_get_socket_cookie, bpf_ktime_get_ns},
    programs::SockAddrContext,
    EbpfContext,
};
use switchyard_common::{
    counter, ipv4_mapped, AffinityKey, AffinityValue, BackendValue, DatapathConfig, FrontendKey,
    SocketReverseKey, SocketReverseValue, DATAPATH_MODE_ACTIVE, PROTOCOL_TCP, PROTOCOL_UDP,
    SCOPE_INTERNAL,
};

use crate::{choose_backend, config, count, BackendChoice, FRONTENDS, SOCKET_REVERSE};

const ALLOW: i32 = 1;
const REFUSE: i32 = 0;
const ADDRESS_FAMILY_INET: u32 = 2;
const SOCKET_TYPE_DATAGRAM: u32 = 2;

/// The configuration, if this socket belongs to the node's network namespace.
#[inline(always)]
fn config_for_this_namespace(ctx: &SockAddrContext) -> Option<&'static DatapathConfig> {
    let config = config()?;
    if config.network_namespace_cookie == 0 {
        return None;
    }
    // SAFETY: helper on the context the kernel passed in.
    let cookie = unsafe { bpf_get_netns_cookie(ctx.as_ptr()) };
    if cookie != config.network_namespace_cookie {
        return None;
    }
    Some(config)
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
    let Some(config) = config_for_this_namespace(ctx) else {
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
    if protocol != PROTOCOL_TCP && protocol != PROTOCOL_UDP {
        return ALLOW;
    }
    // `user_ip4` and `user_port` hold network byte order in memory.
    let frontend_address = ipv4_mapped(ipv4.to_ne_bytes());
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
    if frontend.backend_count == 0 {
        count(counter::NO_BACKEND);
        return REFUSE;
    }
    // Host processes have no source address yet at connect time: for session
    // affinity they count as one client, the node (as with kube-proxy, where they
    // usually leave with the node's address).
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

/// `recvmsg4` and `getpeername4`: show the application the Service address it
/// asked for instead of the backend it was sent to.
pub fn try_reverse(ctx: &SockAddrContext) -> i32 {
    if config_for_this_namespace(ctx).is_none() {
        return ALLOW;
    }
    let address = ctx.sock_addr;
    // SAFETY: 4-byte reads of context fields.
    let (family, ipv4, port) = unsafe {
        (
            core::ptr::read_volatile(&(*address).user_family),
            core::ptr::read_volatile(&(*address).user_ip4),
            core::ptr::read_volatile(&(*address).user_port),
        )
    };
    if family != ADDRESS_FAMILY_INET {
        return ALLOW;
    }
    let key = SocketReverseKey {
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
