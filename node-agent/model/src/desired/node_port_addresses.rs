//! Which local addresses NodePorts are served on: kube-proxy's
//! `--nodeport-addresses` (`nodePortAddresses`) and its localhost NodePorts.
//!
//! - Empty (kube-proxy 1.20's iptables default, and the current iptables
//!   default): every local address (`-m addrtype --dst-type LOCAL`). Here: the
//!   global addresses of every interface of the host, with the Node's own
//!   addresses (standalone's `--node-ip` stands for those).
//! - A list of CIDRs: only the addresses above that some CIDR holds.
//! - `primary` (the default of kube-proxy's nftables mode): the node's primary
//!   address of each family (the first `--node-ip`, else the Node's first
//!   InternalIP, else its first ExternalIP, per family), never loopback.
//!
//! Localhost: kube-proxy's iptables mode serves NodePorts on 127.0.0.1 (IPv4,
//! TCP and UDP, never `::1`) when its `--iptables-localhost-nodeports` is on
//! (the default) and the setting selects a loopback address (empty selects
//! every address; since 1.24 a CIDR list must hold 127.0.0.1; `primary` never
//! does). 127.0.0.1 then joins the served addresses, in the internal scope only
//! ([`internal_scope_only`]): only the node's own processes ever send to it, and
//! the socket hooks translate their connects and datagrams.

use std::net::{IpAddr, Ipv4Addr};

use crate::model::source_ranges::{parse_cidr, Cidr};
use crate::model::AddressFamily;

/// The address kube-proxy serves localhost NodePorts on.
pub const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// kube-proxy's `nodePortAddresses`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum NodePortAddresses {
    /// Every local address (an empty setting).
    #[default]
    Every,
    /// The node's primary address of each family.
    Primary,
    /// The local addresses these ranges hold.
    Ranges(Vec<Cidr>),
}

impl NodePortAddresses {
    /// Parses kube-proxy's values: none (every local address), `primary`
    /// alone, or CIDRs. A value that is neither fails, as kube-proxy's
    /// validation fails: a typo must not silently serve NodePorts elsewhere.
    pub fn parse(values: &[String]) -> Result<Self, String> {
        let values: Vec<&str> = values
            .iter()
            .flat_map(|value| value.split(','))
            .map(str::trim)
            .filter(|value| !value.is_empty())
            .collect();
        match values.as_slice() {
            [] => Ok(Self::Every),
            ["primary"] => Ok(Self::Primary),
            values if values.contains(&"primary") => {
                Err("nodePortAddresses: \"primary\" cannot be combined with CIDRs".to_string())
            }
            values => values
                .iter()
                .map(|value| {
                    parse_cidr(value).ok_or_else(|| {
                        format!("nodePortAddresses: {value:?} is neither a CIDR nor \"primary\"")
                    })
                })
                .collect::<Result<Vec<Cidr>, String>>()
                .map(Self::Ranges),
        }
    }

    /// Whether localhost NodePorts may be served (kube-proxy's
    /// `ContainsIPv4Loopback`).
    pub fn selects_ipv4_loopback(&self) -> bool {
        match self {
            Self::Every => true,
            Self::Primary => false,
            Self::Ranges(ranges) => ranges.iter().any(|range| range.contains(&LOCALHOST)),
        }
    }
}

/// The agent's NodePort settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodePortSettings {
    pub addresses: NodePortAddresses,
    /// kube-proxy's `--iptables-localhost-nodeports` (default on).
    pub localhost: bool,
    /// Standalone's `--node-ip`: when given, the node's addresses instead of
    /// the Node's (standalone has no Node object to read them from).
    pub node_ips: Vec<IpAddr>,
}

impl Default for NodePortSettings {
    fn default() -> Self {
        Self {
            addresses: NodePortAddresses::Every,
            localhost: true,
            node_ips: Vec::new(),
        }
    }
}

/// Whether NodePorts on `address` get only an internal-scope frontend: a
/// loopback address is never the destination of a packet from outside.
pub fn internal_scope_only(address: &IpAddr) -> bool {
    address.is_loopback()
}

/// The addresses NodePorts are served on, sorted and distinct.
///
/// `local`: the host's global addresses (any order); `node`: the Node's
/// addresses, InternalIPs before ExternalIPs, each in the Node's order.
/// Loopback addresses among them are left out: only [`LOCALHOST`] is served,
/// and only as the localhost setting says.
pub fn served_addresses(
    settings: &NodePortSettings,
    local: &[IpAddr],
    node: &[IpAddr],
) -> Vec<IpAddr> {
    let node_addresses: &[IpAddr] = if settings.node_ips.is_empty() {
        node
    } else {
        &settings.node_ips
    };
    let candidates = local
        .iter()
        .chain(node_addresses)
        .copied()
        .filter(|address| !address.is_loopback());
    let mut served: Vec<IpAddr> = match &settings.addresses {
        NodePortAddresses::Every => candidates.collect(),
        NodePortAddresses::Ranges(ranges) => candidates
            .filter(|address| ranges.iter().any(|range| range.contains(address)))
            .collect(),
        NodePortAddresses::Primary => [AddressFamily::Ipv4, AddressFamily::Ipv6]
            .into_iter()
            .filter_map(|family| {
                node_addresses
                    .iter()
                    .find(|address| AddressFamily::of(address) == family && !address.is_loopback())
                    .copied()
            })
            .collect(),
    };
    if settings.localhost && settings.addresses.selects_ipv4_loopback() {
        served.push(LOCALHOST);
    }
    served.sort();
    served.dedup();
    served
}

#[cfg(test)]
mod tests;
