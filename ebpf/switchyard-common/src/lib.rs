#![no_std]
//! Map key and value types shared by Switchyard's kernel programs and user space.
//!
//! Rules every type here follows, because both sides read the same bytes:
//! - `#[repr(C)]` with no hidden padding: every byte belongs to a named field, and
//!   reserved bytes are explicit fields that writers set to zero (a hash map key
//!   with uninitialised padding would never be found again).
//! - Addresses are 16 bytes wide. IPv4 is stored IPv4-mapped (`::ffff:a.b.c.d`), so
//!   IPv6 and dual-stack need no layout change.
//! - Fields that hold network byte order say so in their name (`_big_endian`);
//!   every other integer is in host byte order.
//!
//! The layout is versioned by [`SCHEMA_VERSION`]: the agent pins maps under a
//! directory named after it, so a process of a newer version never misreads old
//! maps: it takes over those whose layout is unchanged and converts the others
//! entry by entry into new maps, with one conversion step per older version in
//! the agent (`node-agent/src/loader/schema`); a newer version's maps are refused
//! (see `docs/datapath.md`, "Schema upgrades").

/// Version of the map layout. Bump it whenever any type below changes size, field
/// order or meaning, and add the conversion step from the previous version to
/// the agent's `loader::schema::STEPS` (a changed order at the same size is
/// invisible to every shape check: only the version tells).
pub const SCHEMA_VERSION: u32 = 2;

pub mod connection;

/// A 16-byte address: IPv6, or IPv4 mapped into IPv6 (`::ffff:a.b.c.d`), network byte order.
pub type Address = [u8; 16];

/// The IPv4-mapped form of an IPv4 address given as its four octets.
pub const fn ipv4_mapped(octets: [u8; 4]) -> Address {
    [
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, octets[0], octets[1], octets[2], octets[3],
    ]
}

/// The four octets of an IPv4-mapped address, or `None` for a real IPv6 address.
pub const fn ipv4_of_mapped(address: &Address) -> Option<[u8; 4]> {
    let mut index = 0;
    while index < 10 {
        if address[index] != 0 {
            return None;
        }
        index += 1;
    }
    if address[10] != 0xff || address[11] != 0xff {
        return None;
    }
    Some([address[12], address[13], address[14], address[15]])
}

/// IP protocol numbers used in keys.
pub const PROTOCOL_TCP: u8 = 6;
pub const PROTOCOL_UDP: u8 = 17;

/// Names of the maps, as declared by the kernel programs and pinned by the agent.
/// BPF object names are limited to 15 characters.
pub mod map_names {
    pub const FRONTENDS: &str = "SY_FRONTENDS";
    pub const BACKEND_SLOTS: &str = "SY_BACKENDS";
    /// The preallocated hash that holds flows; the agent removes expired entries.
    pub const CONNTRACK: &str = "SY_CONNTRACK";
    /// An LRU for the flows `CONNTRACK` has no room for: a full hash never refuses
    /// a new flow, it evicts the oldest overflowed one instead.
    pub const CONNTRACK_OVERFLOW: &str = "SY_CT_OVERFLOW";
    pub const AFFINITY: &str = "SY_AFFINITY";
    pub const CONFIG: &str = "SY_CONFIG";
    pub const COUNTERS: &str = "SY_COUNTERS";
    pub const SOCKET_REVERSE: &str = "SY_SOCK_REVERSE";
    /// The port filter (see [`port_filter`]). Derived state: not part of the
    /// schema, rebuilt by the agent from the other maps at every load.
    pub const PORT_FILTER: &str = "SY_PORTS";
    /// `loadBalancerSourceRanges`: the sources each filtered frontend admits
    /// (see [`SourceRangeKey`]). Added after version 2 shipped without it: an
    /// additive map, created empty where a pin directory lacks it (no schema bump).
    pub const SOURCE_RANGES: &str = "SY_SRC_RANGES";
    /// One per-CPU counter: packets dropped because their source was outside a
    /// frontend's source ranges. A map of its own rather than an entry of
    /// `COUNTERS`, whose pinned size a same-version upgrade keeps.
    pub const SOURCE_RANGE_DROPS: &str = "SY_SRC_DROPS";
    /// IPv4 fragment tracking: the ports of each fragmented datagram, recorded
    /// from its first fragment (the only one carrying them) for its later ones
    /// (see [`FragmentKey`]). Not part of the schema, like the programs' scratch
    /// map: an entry lives for one datagram's fragments, so a new schema version
    /// starts it empty rather than converting it. Additive: created where a pin
    /// directory lacks it.
    pub const FRAGMENTS: &str = "SY_FRAGMENTS";
    /// One per-CPU counter: later fragments whose first fragment the programs
    /// never saw (lost, reordered, or older than the LRU's memory), passed
    /// untranslated. A map of its own, for the reason `SOURCE_RANGE_DROPS` is;
    /// not part of the schema either (a counter starts again from zero).
    pub const FRAGMENTS_WITHOUT_FIRST: &str = "SY_FRAG_ORPHANS";
    /// Per-CPU counters of new flows (and the node's connects and sends) refused
    /// for lack of a backend, by [`super::refusal`] index: whether the Service had
    /// ready endpoints elsewhere, as the agent knew when it wrote the frontend
    /// ([`super::FRONTEND_FLAG_ENDPOINTS_ELSEWHERE`]). A map of its own for the
    /// reason `SOURCE_RANGE_DROPS` is, and not part of the schema either (a
    /// counter starts again from zero).
    pub const REFUSALS: &str = "SY_REFUSALS";
    /// Per-CPU totals of the `sock_ops` connection signals, by
    /// [`super::connection`] index (failed connects, SYN retransmissions,
    /// resets). Additive and not part of the schema, like `REFUSALS`.
    pub const CONNECTIONS: &str = "SY_CONNECTIONS";
    /// The same signals by Service frontend ([`super::FrontendKey`] to
    /// [`super::connection::ConnectionCounts`]), in a per-CPU LRU: the Services
    /// most affected. Additive and not part of the schema either.
    pub const CONNECTIONS_BY_FRONTEND: &str = "SY_CONN_BY_SVC";
}

/// Indexes of the [`map_names::REFUSALS`] per-CPU counters.
pub mod refusal {
    /// The frontend had no backend and the Service no ready (or serving
    /// terminating) endpoint anywhere: refused by design, as kube-proxy refuses.
    pub const WITHOUT_READY_ENDPOINTS: u32 = 0;
    /// The frontend had no backend while the Service had endpoints on other
    /// nodes (a `Local` traffic policy without a local endpoint).
    pub const WITH_ENDPOINTS_ELSEWHERE: u32 = 1;
    /// Entries of the map.
    pub const COUNT: u32 = 2;
}

/// A pre-filter in front of the conntrack lookups, in an array map of one byte per
/// (role, port): TC ingress looks a packet up in conntrack only if its destination
/// port is one some frontend uses (or it goes to the hairpin address), TC egress
/// only if its source port is one some backend uses. Every packet of a translated
/// flow passes the filter; most other packets (pod to pod, host traffic) skip the
/// hash lookups, which an array lookup, inlined by the verifier, replaces.
///
/// Entries are only ever set: a port stays marked after its last frontend or
/// backend goes, because flows opened through it may still be alive, and a marked
/// port costs only a lookup. The agent marks a port before it writes the entry
/// that uses it, and marks every port the maps, live flows and the socket hooks'
/// reverse entries hold when it loads a filter that is not yet built. The socket
/// hooks' `getpeername4` and `recvmsg4` use the backend ports too: a translated
/// socket's peer is a backend.
pub mod port_filter {
    /// First entry of the frontend ports (packets' destination ports at ingress).
    pub const FRONTEND_PORTS: u32 = 0;
    /// First entry of the backend ports (packets' source ports at egress).
    pub const BACKEND_PORTS: u32 = 1 << 16;
    /// Not a port: set once a load has marked every port the other maps hold
    /// (a filter without it is new, or was left half-built by a process that
    /// died, and is built again).
    pub const BUILT: u32 = 2 << 16;
    /// Entries in the map: both roles, every port, and [`BUILT`].
    pub const ENTRIES: u32 = BUILT + 1;
    /// The value of a marked port (an unmarked one is zero).
    pub const MARKED: u8 = 1;

    /// The entry of `port_big_endian` (as on the wire, read as a native `u16`,
    /// the form keys hold) in `role` ([`FRONTEND_PORTS`] or [`BACKEND_PORTS`]).
    #[inline(always)]
    pub const fn index(role: u32, port_big_endian: u16) -> u32 {
        role + port_big_endian as u32
    }
}

/// Names of the programs (kernel object names are limited to 15 characters).
pub mod program_names {
    /// TC ingress on the host side of pod interfaces (scope internal).
    pub const INGRESS_POD: &str = "sy_ingress_pod";
    /// TC ingress on the node's external interfaces (scope external).
    pub const INGRESS_HOST: &str = "sy_ingress_host";
    /// TC egress on both kinds of interface: reverse translation of replies.
    pub const EGRESS: &str = "sy_egress";
    /// Socket hooks on the cgroup v2 root, for the node's own processes.
    pub const CONNECT4: &str = "sy_connect4";
    pub const SENDMSG4: &str = "sy_sendmsg4";
    pub const RECVMSG4: &str = "sy_recvmsg4";
    pub const GETPEERNAME4: &str = "sy_getpeername4";
    /// The same for IPv6 sockets (IPv6 Services, and IPv4 ones named by an
    /// IPv4-mapped address), attached only when IPv6 is a served family.
    pub const CONNECT6: &str = "sy_connect6";
    pub const SENDMSG6: &str = "sy_sendmsg6";
    pub const RECVMSG6: &str = "sy_recvmsg6";
    pub const GETPEERNAME6: &str = "sy_getpeername6";
    /// On the same cgroup: removes a closing socket's reverse entry.
    pub const SOCK_RELEASE: &str = "sy_sock_release";
    /// On the same cgroup: counts failed connects, SYN retransmissions and
    /// resets of TCP connections to Service addresses.
    pub const SOCK_OPS: &str = "sy_sock_ops";
}

/// Timeouts the programs use when the config entry leaves them at zero.
pub const DEFAULT_TCP_IDLE_TIMEOUT_SECONDS: u32 = 6 * 60 * 60;
pub const DEFAULT_TCP_CLOSING_TIMEOUT_SECONDS: u32 = 10;
pub const DEFAULT_UDP_IDLE_TIMEOUT_SECONDS: u32 = 120;

/// Where a packet came from, which decides the traffic policy that applies:
/// `internalTrafficPolicy` for traffic from this node's pods and host processes,
/// `externalTrafficPolicy` for traffic that arrived on an external interface.
pub const SCOPE_INTERNAL: u8 = 0;
pub const SCOPE_EXTERNAL: u8 = 1;

/// Key of the frontends map: one Service address and port as seen by clients.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FrontendKey {
    /// ClusterIP, node IP (NodePort), external IP or load-balancer IP.
    pub address: Address,
    pub port_big_endian: u16,
    /// [`PROTOCOL_TCP`] or [`PROTOCOL_UDP`].
    pub protocol: u8,
    /// [`SCOPE_INTERNAL`] or [`SCOPE_EXTERNAL`].
    pub scope: u8,
}

/// Pick the backend with session affinity (`sessionAffinity: ClientIP`).
pub const FRONTEND_FLAG_SESSION_AFFINITY: u32 = 1 << 0;
/// Keep the client's source address (`externalTrafficPolicy: Local`): never masquerade.
pub const FRONTEND_FLAG_PRESERVE_CLIENT_ADDRESS: u32 = 1 << 1;
/// A NodePort, external or load-balancer frontend: traffic to a backend on another
/// node is masqueraded so that its replies come back through this node.
pub const FRONTEND_FLAG_MASQUERADE_REMOTE: u32 = 1 << 2;
/// A load-balancer frontend with `loadBalancerSourceRanges`: the TC programs admit
/// a new flow only from a source the source ranges map holds under this frontend's
/// key, and drop (never reject) the others, as kube-proxy does. Frontends written
/// before the bit existed never carry it, so their meaning is unchanged (no layout
/// change), and programs older than the bit ignore it (they filter nothing, as
/// before).
pub const FRONTEND_FLAG_SOURCE_RANGES: u32 = 1 << 3;
/// With [`FRONTEND_FLAG_SOURCE_RANGES`]: no range holds an address of the node,
/// so the socket hooks refuse the node's own processes (they cannot see the
/// source address a connect will use; kube-proxy's outcome for them is decided
/// by the node's address, and the agent decides it the same way).
pub const FRONTEND_FLAG_NODE_OUTSIDE_SOURCE_RANGES: u32 = 1 << 4;
/// On the internal-scope entry of a NodePort, external or load-balancer address
/// whose external entry balances over other endpoints (`externalTrafficPolicy:
/// Local`): which of the two applies depends on where a client enters the node,
/// which the TC programs see and the socket hooks do not (to them every
/// namespace but the node's is a pod, a client's namespace on the node as much
/// as a pod's), so pods' connects to it are left to TC.
pub const FRONTEND_FLAG_NO_POD_CONNECT_BALANCING: u32 = 1 << 5;
/// On an external-scope entry without backends (`externalTrafficPolicy: Local`,
/// no local endpoint) of a Service with endpoints elsewhere: new flows are
/// dropped, not refused, as kube-proxy does (1.20: KUBE-XLB to KUBE-MARK-DROP;
/// current: DROP), so that the client of a load balancer whose health check has
/// not yet failed retries instead of giving up. Programs older than the bit
/// refuse, as before.
pub const FRONTEND_FLAG_DROP_WITHOUT_BACKENDS: u32 = 1 << 6;
/// On an entry without backends of a Service that has ready (or serving
/// terminating) endpoints on some node: what the programs' refusal counters
/// ([`map_names::REFUSALS`]) attribute the refusals of its new flows by. Set by
/// the agent from its desired state only on frontends without backends (so no
/// other frontend changes value); counting only, no program acts on it.
/// Frontends written before the bit existed count as without endpoints until
/// the agent's next write of them.
pub const FRONTEND_FLAG_ENDPOINTS_ELSEWHERE: u32 = 1 << 7;

/// Value of the frontends map.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FrontendValue {
    /// Identifies the set of backends this frontend balances over, in the backend
    /// slots map. Frontends with the same backend set share a group.
    pub group_id: u32,
    /// Number of backends new flows choose from (slots `0..backend_count`).
    /// Zero means the Service has no usable endpoint: new flows are refused.
    pub backend_count: u32,
    /// `FRONTEND_FLAG_*` bits.
    pub flags: u32,
    /// Affinity timeout (`sessionAffinityConfig.clientIP.timeoutSeconds`).
    pub affinity_timeout_seconds: u32,
}

/// The data of a source ranges map key (an LPM trie): a frontend, then a source
/// address. The trie's prefix length always covers the whole frontend key
/// ([`SOURCE_RANGE_FRONTEND_BITS`]) plus the range's length in the 128-bit
/// address (an IPv4 `/n` is `96 + n`, the address being IPv4-mapped), so a
/// lookup with a packet's frontend and full source address finds an entry
/// exactly when a range of that very frontend holds the source.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SourceRangeKey {
    pub frontend: FrontendKey,
    /// The range's first address (bits past its length are zero).
    pub source_address: Address,
}

/// Bits of a source range key that hold the frontend, matched in full.
pub const SOURCE_RANGE_FRONTEND_BITS: u32 = (core::mem::size_of::<FrontendKey>() * 8) as u32;
/// The value of every source ranges entry (the key is what matters).
pub const SOURCE_RANGE_ADMITTED: u8 = 1;

/// Key of the backend slots map: the `ordinal`th backend of a group.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BackendSlotKey {
    pub group_id: u32,
    pub ordinal: u32,
}

/// The backend is an endpoint on this node.
pub const BACKEND_FLAG_LOCAL: u16 = 1 << 0;

/// Value of the backend slots map: one endpoint address and target port.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BackendValue {
    pub address: Address,
    pub port_big_endian: u16,
    /// `BACKEND_FLAG_*` bits.
    pub flags: u16,
}

/// Key of the connection tracking map: a packet's addresses and ports as they
/// arrive, before translation. Each tracked connection has two entries: one for
/// the client's direction (keyed by client -> frontend) and one for the reply
/// direction (keyed by backend -> client as the reply arrives).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConntrackKey {
    pub source_address: Address,
    pub destination_address: Address,
    pub source_port_big_endian: u16,
    pub destination_port_big_endian: u16,
    pub protocol: u8,
    /// Always zero.
    pub reserved: [u8; 3],
}

/// Key of the fragments map: one fragmented datagram as a TC hook sees it. IPv4
/// fragments after the first carry no transport header, so their ports are the
/// ones the hook recorded from the datagram's first fragment under this key (the
/// fields every fragment of a datagram shares, RFC 791), as Cilium does.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FragmentKey {
    pub source_address: Address,
    pub destination_address: Address,
    /// The IP header's identification field.
    pub identification_big_endian: u16,
    pub protocol: u8,
    /// `FRAGMENT_SEEN_AT_*`: ingress and egress record apart, so a datagram whose
    /// ports one hook translated (addresses unchanged) never gives the other
    /// hook's later fragments the translated ports.
    pub seen_at: u8,
}

/// [`FragmentKey::seen_at`]: a TC ingress program recorded the entry.
pub const FRAGMENT_SEEN_AT_INGRESS: u8 = 0;
/// [`FragmentKey::seen_at`]: the TC egress program recorded the entry.
pub const FRAGMENT_SEEN_AT_EGRESS: u8 = 1;

/// Value of the fragments map: the ports of the datagram's first fragment, as on
/// the wire before the hook translated it.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FragmentPorts {
    pub source_port_big_endian: u16,
    pub destination_port_big_endian: u16,
}

/// Rewrite the destination address and port to `new_destination_*`.
pub const CONNTRACK_FLAG_REWRITE_DESTINATION: u8 = 1 << 0;
/// Rewrite the source address and port to `new_source_*`.
pub const CONNTRACK_FLAG_REWRITE_SOURCE: u8 = 1 << 1;
/// This entry describes the reply direction of its connection.
pub const CONNTRACK_FLAG_REPLY: u8 = 1 << 2;
/// Translated packets of this connection are marked for masquerading.
pub const CONNTRACK_FLAG_MASQUERADE: u8 = 1 << 3;
/// The client's source port was translated (`new_source_port_big_endian` of the
/// client-direction entry, `new_destination_port_big_endian` of the reply entry),
/// because another live flow from the same client address and port already went
/// to the same backend through another frontend (netfilter's NAT does the same).
/// With this bit, the source/destination rewrite bits mean only that, never a
/// hairpin flow sent straight back. Entries written before the bit existed never
/// carry it, so their meaning is unchanged (no layout change).
pub const CONNTRACK_FLAG_PORT_TRANSLATED: u8 = 1 << 4;
/// A client-direction entry written by programs that record the backend's first
/// packet in `TCP_STATE_REPLY_SEEN`: without the bit, its flow has never been
/// answered. Entries written before the bit existed (pinned maps survive agent
/// upgrades) never carry this flag, so a reader knows not to trust the missing bit
/// there (no layout change: a spare bit of `flags`).
pub const CONNTRACK_FLAG_RECORDS_REPLY: u8 = 1 << 5;

/// TCP teardown seen in the client's direction.
pub const TCP_STATE_FIN_FROM_CLIENT: u8 = 1 << 0;
/// TCP teardown seen in the reply direction.
pub const TCP_STATE_FIN_FROM_BACKEND: u8 = 1 << 1;
/// A reset was seen in either direction.
pub const TCP_STATE_RESET: u8 = 1 << 2;
/// The reply entry of a TCP flow has seen a packet from the backend (set on both
/// entries, once, by the first one): the flow was answered. A flow whose backend
/// never answered (SYNs to a gone or silent endpoint, retried by the client) lacks
/// it, which timestamps alone cannot tell from an idle connection whose client
/// spoke last. Only meaningful on an entry with `CONNTRACK_FLAG_RECORDS_REPLY`.
pub const TCP_STATE_REPLY_SEEN: u8 = 1 << 3;

/// Value of the connection tracking map.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConntrackValue {
    pub new_source_address: Address,
    pub new_destination_address: Address,
    pub new_source_port_big_endian: u16,
    pub new_destination_port_big_endian: u16,
    /// `CONNTRACK_FLAG_*` bits.
    pub flags: u8,
    /// `TCP_STATE_*` bits (zero for UDP).
    pub tcp_state: u8,
    /// Always zero.
    pub reserved: [u8; 2],
    /// `bpf_ktime_get_ns` of the last packet; entries past their timeout are ignored
    /// (and overwritten by the next SYN) even before the LRU evicts them.
    pub last_seen_nanoseconds: u64,
}

/// Key of the session-affinity map.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AffinityKey {
    pub client_address: Address,
    pub group_id: u32,
}

/// Value of the session-affinity map: the backend a client was sent to last.
/// It is honoured only while slot `ordinal` of the group still holds this very
/// backend, so a removed backend never keeps receiving a client's new flows.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AffinityValue {
    pub backend_address: Address,
    pub backend_port_big_endian: u16,
    /// Always zero.
    pub reserved: u16,
    pub ordinal: u32,
    pub last_used_nanoseconds: u64,
}

/// Key of the socket reverse-translation map, written by the `connect4`/`sendmsg4`
/// hooks when they send a host socket to a backend, and read by `recvmsg4` and
/// `getpeername4`, so the application sees the Service address it asked for.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SocketReverseKey {
    /// `bpf_get_socket_cookie` of the socket.
    pub socket_cookie: u64,
    pub backend_address: Address,
    pub backend_port_big_endian: u16,
    /// Always zero.
    pub reserved: [u8; 6],
}

/// Value of the socket reverse-translation map: the frontend the socket asked for.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SocketReverseValue {
    pub frontend_address: Address,
    pub frontend_port_big_endian: u16,
    /// Always zero.
    pub reserved: u16,
}

/// Translate new flows and existing flows.
pub const DATAPATH_MODE_ACTIVE: u32 = 1;
/// Translate only flows already in Switchyard's conntrack; new connections pass
/// untranslated to whatever else implements Services (kube-proxy's rules).
pub const DATAPATH_MODE_DRAINING: u32 = 2;

/// The single entry of the config map, written by the agent.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct DatapathConfig {
    /// Source address used when a pod reaches a Service that picks that same pod
    /// (hairpin), so its reply is routed back through the node to be translated.
    pub hairpin_address: Address,
    /// Network namespace cookie of the node: socket hooks, which are attached to a
    /// cgroup and so see every namespace, act only on sockets of this namespace.
    pub network_namespace_cookie: u64,
    /// `DATAPATH_MODE_*`. Zero (an unwritten config) behaves as draining, so a
    /// program never translates a new flow before the agent has configured it.
    pub mode: u32,
    /// `skb->mark` bit set on packets that must be masqueraded on their way out.
    pub masquerade_mark: u32,
    pub tcp_idle_timeout_seconds: u32,
    /// How long a TCP entry lives after FIN or RST, so the teardown is translated.
    pub tcp_closing_timeout_seconds: u32,
    pub udp_idle_timeout_seconds: u32,
    /// `POD_CONNECT_BALANCING_*`: whether the socket hooks also translate TCP connects
    /// of sockets in other network namespaces (pods). This was a reserved field,
    /// always zero, before it had a meaning: zero keeps the behaviour it had then
    /// (host namespace only), so neither the layout nor `SCHEMA_VERSION` changes.
    pub pod_connect_balancing: u32,
}

/// `DatapathConfig::pod_connect_balancing`: pods' Service traffic is translated per
/// packet by the TC programs only.
pub const POD_CONNECT_BALANCING_DISABLED: u32 = 0;
/// `DatapathConfig::pod_connect_balancing`: a pod's TCP connect to a Service is
/// pointed at a backend by the connect hook, so its packets need no translation;
/// what that cannot express as well as TC (UDP, session affinity, masquerading,
/// a Service without endpoints) stays with the TC programs.
pub const POD_CONNECT_BALANCING_TCP: u32 = 1;

/// Indexes of the per-CPU counters array.
pub mod counter {
    /// New flows translated to a backend.
    pub const TRANSLATED: u32 = 0;
    /// New flows refused because the Service had no usable backend.
    pub const NO_BACKEND: u32 = 1;
    /// Packets that matched a conntrack entry.
    pub const CONNTRACK_HIT: u32 = 2;
    /// Packets to a frontend that had no conntrack entry.
    pub const CONNTRACK_MISS: u32 = 3;
    /// Packets the program could not handle (malformed, helper failures).
    pub const ERROR: u32 = 4;
    /// Non-SYN TCP packets to a frontend with no Switchyard conntrack entry, passed
    /// untranslated to netfilter (flows that kube-proxy's rules translated).
    pub const PASSED_UNTRACKED: u32 = 5;
    /// Reply packets translated back to the frontend.
    pub const REVERSE_TRANSLATED: u32 = 6;
    /// Conntrack entries written to the overflow LRU because the hash was full.
    pub const CONNTRACK_OVERFLOW: u32 = 7;
    /// Number of counters.
    pub const COUNT: u32 = 8;
}

#[cfg(feature = "user")]
mod user {
    use super::*;
    // SAFETY: every type is `#[repr(C)]`, `Copy`, made only of integers and byte
    // arrays, and has no padding (checked by the size assertions below), so any
    // bit pattern is a valid value.
    unsafe impl aya::Pod for FrontendKey {}
    unsafe impl aya::Pod for FrontendValue {}
    unsafe impl aya::Pod for BackendSlotKey {}
    unsafe impl aya::Pod for BackendValue {}
    unsafe impl aya::Pod for ConntrackKey {}
    unsafe impl aya::Pod for ConntrackValue {}
    unsafe impl aya::Pod for AffinityKey {}
    unsafe impl aya::Pod for AffinityValue {}
    unsafe impl aya::Pod for DatapathConfig {}
    unsafe impl aya::Pod for SocketReverseKey {}
    unsafe impl aya::Pod for SocketReverseValue {}
    unsafe impl aya::Pod for SourceRangeKey {}
    unsafe impl aya::Pod for FragmentKey {}
    unsafe impl aya::Pod for FragmentPorts {}
    unsafe impl aya::Pod for super::connection::ConnectionCounts {}
}

// No hidden padding: each size is the sum of the field sizes.
const _: () = {
    use core::mem::size_of;
    assert!(size_of::<FrontendKey>() == 16 + 2 + 1 + 1);
    assert!(size_of::<FrontendValue>() == 4 * 4);
    assert!(size_of::<BackendSlotKey>() == 4 + 4);
    assert!(size_of::<BackendValue>() == 16 + 2 + 2);
    assert!(size_of::<ConntrackKey>() == 16 + 16 + 2 + 2 + 1 + 3);
    assert!(size_of::<ConntrackValue>() == 16 + 16 + 2 + 2 + 1 + 1 + 2 + 8);
    assert!(size_of::<AffinityKey>() == 16 + 4);
    assert!(size_of::<AffinityValue>() == 16 + 2 + 2 + 4 + 8);
    assert!(size_of::<DatapathConfig>() == 16 + 8 + 4 * 6);
    assert!(size_of::<SocketReverseKey>() == 8 + 16 + 2 + 6);
    assert!(size_of::<SocketReverseValue>() == 16 + 2 + 2);
    assert!(size_of::<SourceRangeKey>() == 20 + 16);
    assert!(size_of::<FragmentKey>() == 16 + 16 + 2 + 1 + 1);
    assert!(size_of::<FragmentPorts>() == 2 + 2);
    assert!(size_of::<connection::ConnectionCounts>() == 3 * 8);
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_port_of_both_roles_has_its_own_port_filter_entry() {
        use port_filter::*;
        assert_eq!(index(FRONTEND_PORTS, 0), 0);
        assert_eq!(index(FRONTEND_PORTS, u16::MAX), BACKEND_PORTS - 1);
        assert_eq!(index(BACKEND_PORTS, 0), BACKEND_PORTS);
        assert_eq!(index(BACKEND_PORTS, u16::MAX), BUILT - 1);
    }

    #[test]
    fn an_ipv4_address_round_trips_through_its_mapped_form() {
        let mapped = ipv4_mapped([10, 96, 0, 1]);
        assert_eq!(&mapped[..12], &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff]);
        assert_eq!(ipv4_of_mapped(&mapped), Some([10, 96, 0, 1]));
    }

    #[test]
    fn a_real_ipv6_address_is_not_taken_for_ipv4() {
        let mut address = [0u8; 16];
        address[0] = 0xfd;
        address[15] = 1;
        assert_eq!(ipv4_of_mapped(&address), None);
        assert_eq!(ipv4_of_mapped(&[0u8; 16]), None);
    }

    #[test]
    fn map_names_fit_the_kernel_object_name_limit() {
        for name in [
            map_names::FRONTENDS,
            map_names::BACKEND_SLOTS,
            map_names::CONNTRACK,
            map_names::AFFINITY,
            map_names::CONFIG,
            map_names::COUNTERS,
            map_names::SOCKET_REVERSE,
            map_names::PORT_FILTER,
            map_names::SOURCE_RANGES,
            map_names::SOURCE_RANGE_DROPS,
            map_names::FRAGMENTS,
            map_names::FRAGMENTS_WITHOUT_FIRST,
            map_names::REFUSALS,
            map_names::CONNECTIONS,
            map_names::CONNECTIONS_BY_FRONTEND,
        ] {
            assert!(name.len() <= 15, "{name} is longer than 15 characters");
        }
    }
}
