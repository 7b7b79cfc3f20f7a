//! `sock_ops`: the kernel's view of TCP connections to Service addresses
//! (issue 28's connection signals), counted per CPU in total and per Service
//! frontend: connects that failed (closed before established: a reset or a
//! timeout), SYN retransmissions, and established connections reset (see
//! `switchyard_common::connection` for what each state change counts).
//!
//! It counts and translates nothing, so it is safe on a node still served by
//! kube-proxy, which is what gives every node a baseline before it switches.
//!
//! Cheap for every other connection: the connect callback, which the kernel
//! calls for every active TCP socket of the cgroup anyway, looks the
//! destination up (behind the port filter's array lookup) and asks for the
//! state-change and retransmit callbacks only for a socket that goes to a
//! Service. Once such a connection is established it keeps only the
//! state-change callback; the frontend is looked up again only when a state
//! change or a retransmission counts something.
//!
//! The Service of a socket: its destination as a frontend (what a pod's
//! connect and kube-proxy's DNAT keep until the packet leaves), or, when the
//! connect hook already translated it to a backend, the socket's reverse entry
//! (the same lookup `getpeername` answers from).

use aya_ebpf::{
    bindings::{
        BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB, BPF_SOCK_OPS_RETRANS_CB, BPF_SOCK_OPS_RETRANS_CB_FLAG,
        BPF_SOCK_OPS_STATE_CB, BPF_SOCK_OPS_STATE_CB_FLAG, BPF_SOCK_OPS_TCP_CONNECT_CB,
    },
    helpers::bpf_get_socket_cookie,
    macros::{map, sock_ops},
    maps::{LruPerCpuHashMap, PerCpuArray},
    programs::SockOpsContext,
    EbpfContext,
};
use switchyard_common::{
    connection::{self, ConnectionCounts},
    ipv4_mapped, port_filter, Address, FrontendKey, SocketReverseKey, PROTOCOL_TCP, SCOPE_INTERNAL,
};

use crate::{port_marked, FRONTENDS, SOCKET_REVERSE};

/// Whatever it finds, a `sock_ops` program answers "go on" (its return value
/// only matters to callbacks this program does not answer).
const CONTINUE: u32 = 1;
const ADDRESS_FAMILY_INET: u32 = 2;
const ADDRESS_FAMILY_INET6: u32 = 10;
/// No element of that key yet (`BPF_NOEXIST`): two CPUs counting the first
/// event of one frontend at once must not overwrite each other's element.
const BPF_NOEXIST: u64 = 1;

/// Per-CPU totals, by `connection` index.
#[map(name = "SY_CONNECTIONS")]
static CONNECTIONS: PerCpuArray<u64> = PerCpuArray::pinned(connection::COUNT, 0);

/// The same counts by Service frontend. An LRU: the Services with events
/// recently are the ones the agent reports; 1,024 of them are far more than a
/// report names, and a per-CPU map's memory grows with the CPUs.
#[map(name = "SY_CONN_BY_SVC")]
static CONNECTIONS_BY_FRONTEND: LruPerCpuHashMap<FrontendKey, ConnectionCounts> =
    LruPerCpuHashMap::pinned(1_024, 0);

#[sock_ops]
pub fn sy_sock_ops(ctx: SockOpsContext) -> u32 {
    match ctx.op() {
        BPF_SOCK_OPS_TCP_CONNECT_CB => on_connect(&ctx),
        BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB => on_established(&ctx),
        BPF_SOCK_OPS_STATE_CB => {
            // args[0]: the old state, args[1]: the new one.
            if let Some(index) = connection::state_change_signal(ctx.arg(0), ctx.arg(1)) {
                count(&ctx, index);
            }
        }
        BPF_SOCK_OPS_RETRANS_CB => {
            // SAFETY: a field every sock_ops callback may read.
            let state = unsafe { core::ptr::read_volatile(&(*ctx.ops).state) };
            if let Some(index) = connection::retransmit_signal(state) {
                count(&ctx, index);
            }
        }
        _ => {}
    }
    CONTINUE
}

/// A new active connection: followed if it goes to a Service with some
/// backend. A connect to a frontend without backends is refused by design (as
/// kube-proxy refuses it), and counted as such by the datapath (`SY_REFUSALS`),
/// not as a failed connect.
#[inline(always)]
fn on_connect(ctx: &SockOpsContext) {
    if service_of(ctx, true).is_some() {
        // A failure (a kernel without one of the flags) only leaves the
        // socket unfollowed.
        let _ =
            ctx.set_cb_flags((BPF_SOCK_OPS_STATE_CB_FLAG | BPF_SOCK_OPS_RETRANS_CB_FLAG) as i32);
    }
}

/// A followed connection established: no SYN is retransmitted any more, and
/// the retransmit callback would run for every lost data segment.
#[inline(always)]
fn on_established(ctx: &SockOpsContext) {
    if ctx.cb_flags() & BPF_SOCK_OPS_RETRANS_CB_FLAG != 0 {
        let _ = ctx.set_cb_flags(BPF_SOCK_OPS_STATE_CB_FLAG as i32);
    }
}

/// The Service frontend the socket connects to, if any (with `with_backends`:
/// only one that has some backend now; a socket translated at connect had one).
#[inline(always)]
fn service_of(ctx: &SockOpsContext, with_backends: bool) -> Option<FrontendKey> {
    let ops = ctx.ops;
    // SAFETY: reads of fields every sock_ops callback may read, all up front
    // and unconditionally (a read inside a branch can share an offset context
    // pointer between branches, which the verifier refuses).
    let (family, remote_ipv4, remote_ipv6, remote_port) = unsafe {
        (
            core::ptr::read_volatile(&(*ops).family),
            core::ptr::read_volatile(&(*ops).remote_ip4),
            [
                core::ptr::read_volatile(&(*ops).remote_ip6[0]),
                core::ptr::read_volatile(&(*ops).remote_ip6[1]),
                core::ptr::read_volatile(&(*ops).remote_ip6[2]),
                core::ptr::read_volatile(&(*ops).remote_ip6[3]),
            ],
            core::ptr::read_volatile(&(*ops).remote_port),
        )
    };
    // `remote_port` holds the port in network byte order in its upper 16 bits
    // (the kernel loads the socket's `__be16` and shifts it), so this is the
    // port as the keys hold it.
    let port_big_endian = (remote_port >> 16) as u16;
    let address: Address = match family {
        ADDRESS_FAMILY_INET => ipv4_mapped(remote_ipv4.to_ne_bytes()),
        ADDRESS_FAMILY_INET6 => {
            let mut address = [0u8; 16];
            for (index, word) in remote_ipv6.iter().enumerate() {
                address[index * 4..index * 4 + 4].copy_from_slice(&word.to_ne_bytes());
            }
            address
        }
        _ => return None,
    };
    if port_marked(port_filter::FRONTEND_PORTS, port_big_endian) {
        let key = FrontendKey {
            address,
            port_big_endian,
            protocol: PROTOCOL_TCP,
            scope: SCOPE_INTERNAL,
        };
        if let Some(frontend) = FRONTENDS.get_ptr(&key) {
            // SAFETY: a read of one field of an entry valid for this program run.
            let backend_count = unsafe { core::ptr::read_volatile(&(*frontend).backend_count) };
            return (!with_backends || backend_count > 0).then_some(key);
        }
    }
    // Translated at connect: the destination is a backend, whose port the
    // port filter has marked.
    if !port_marked(port_filter::BACKEND_PORTS, port_big_endian) {
        return None;
    }
    let reverse_key = SocketReverseKey {
        // SAFETY: helper on the context the kernel passed in.
        socket_cookie: unsafe { bpf_get_socket_cookie(ctx.as_ptr()) },
        backend_address: address,
        backend_port_big_endian: port_big_endian,
        reserved: [0; 6],
    };
    // SAFETY: copied out at once.
    let reverse = unsafe { SOCKET_REVERSE.get(&reverse_key) }.copied()?;
    Some(FrontendKey {
        address: reverse.frontend_address,
        port_big_endian: reverse.frontend_port_big_endian,
        protocol: PROTOCOL_TCP,
        scope: SCOPE_INTERNAL,
    })
}

/// Counts one event of a followed socket in the totals, and under its
/// frontend when that is still found (a Service removed since the connect is
/// counted in the totals only).
#[inline(always)]
fn count(ctx: &SockOpsContext, index: u32) {
    if let Some(total) = CONNECTIONS.get_ptr_mut(index) {
        // SAFETY: a per-CPU slot is only touched by this CPU.
        unsafe { *total += 1 };
    }
    let Some(frontend) = service_of(ctx, false) else {
        return;
    };
    if let Some(counts) = CONNECTIONS_BY_FRONTEND.get_ptr_mut(&frontend) {
        // SAFETY: this CPU's value of the element, for this program run.
        if let Some(slot) = unsafe { (*counts).slot(index) } {
            *slot += 1;
        }
        return;
    }
    let mut first = ConnectionCounts::default();
    if let Some(slot) = first.slot(index) {
        *slot = 1;
    }
    if CONNECTIONS_BY_FRONTEND
        .insert(&frontend, &first, BPF_NOEXIST)
        .is_err()
    {
        // Another CPU made the element in between: count in this CPU's value.
        if let Some(counts) = CONNECTIONS_BY_FRONTEND.get_ptr_mut(&frontend) {
            // SAFETY: as above.
            if let Some(slot) = unsafe { (*counts).slot(index) } {
                *slot += 1;
            }
        }
    }
}
