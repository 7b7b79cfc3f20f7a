//! Command line of `switchyard-agent`.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::datapath::{DatapathOptions, PodConnectBalancing, SocketHookCgroup};
use crate::desired::node_port_addresses::{NodePortAddresses, NodePortSettings};
use crate::interfaces::{Globs, DEFAULT_POD_INTERFACE_GLOBS};
use crate::model::ServedFamilies;
use crate::standalone::StandaloneOptions;

pub const DEFAULT_PIN_DIRECTORY: &str = "/sys/fs/bpf/switchyard";

#[derive(Debug, Parser)]
#[command(
    name = "switchyard-agent",
    version,
    about = "Switchyard's per-node agent: Services in TC programs."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Program the datapath from manifest files, without a cluster.
    Standalone(StandaloneArguments),
    /// Run in a cluster (the DaemonSet's command): follow this node's DataplaneNode.
    Run(RunArguments),
    /// Remove every program, link and map this agent pinned.
    Detach(DetachArguments),
    /// Mount a BPF filesystem at the pin directory's parent unless one holds the
    /// pin directory already (the chart's privileged init container runs this,
    /// so that the mount reaches the host through `Bidirectional` propagation).
    MountBpfFs(DetachArguments),
}

#[derive(Debug, Args)]
pub struct RunArguments {
    /// This node's name (the chart sets it from the downward API).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: String,
    #[command(flatten)]
    pub datapath: DatapathArguments,
    #[command(flatten)]
    pub node_ports: NodePortArguments,
    /// Where /metrics, /healthz and /readyz are served.
    #[arg(long, default_value = "0.0.0.0:9964")]
    pub metrics_address: std::net::SocketAddr,
    /// Minimum time between two applies (`1s`, `500ms`).
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub min_sync_period: Duration,
    /// How long the start-of-day gate waits before reporting `HostMetadataTimeout`
    /// (it keeps waiting after that).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub gate_timeout: Duration,
    /// The agent pod's `controller-revision-hash`, reported in status.
    #[arg(long, env = "AGENT_REVISION")]
    pub agent_revision: Option<String>,
    /// kube-proxy's healthz, probed while its rules are on the node.
    #[arg(long, default_value = "http://127.0.0.1:10256/healthz")]
    pub kube_proxy_healthz: String,
    /// How often kube-proxy's rules, health and the chain order are checked.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub coexistence_interval: Duration,
    /// How long kube-proxy's healthz must refuse connections (in every check, at
    /// least two) before its rules are removed: a kube-proxy restarting in place
    /// is never taken for gone.
    #[arg(long, default_value = "6s", value_parser = parse_duration)]
    pub kube_proxy_absence_confirmation: Duration,
    /// Do not serve kube-proxy's healthz port after kube-proxy has left.
    #[arg(long)]
    pub no_replacement_healthz: bool,
    #[arg(long, default_value_t = crate::kube_proxy::health::KUBE_PROXY_HEALTHZ_PORT)]
    pub replacement_healthz_port: u16,
    /// kube-proxy's `--metrics-bind-address`: kube-proxy's metrics are served there, under
    /// their names, while kube-proxy's health ports are (once it has left the node). Empty:
    /// not served (as kube-proxy takes an empty address).
    #[arg(
        long,
        default_value = crate::kube_proxy::metrics::KUBE_PROXY_METRICS_ADDRESS,
        value_parser = parse_optional_address
    )]
    pub kube_proxy_metrics_address: OptionalAddress,
}

/// Where NodePorts are served: kube-proxy's `--nodeport-addresses` and
/// `--iptables-localhost-nodeports`, with kube-proxy 1.20 iptables' defaults
/// (every local address, 127.0.0.1 included), so a node switched from it keeps
/// every NodePort its users reach.
#[derive(Debug, Args)]
pub struct NodePortArguments {
    /// kube-proxy's `nodePortAddresses`, comma-separated: empty (the default)
    /// for every local address, CIDRs for the local addresses they hold, or
    /// `primary` for the node's primary address of each family.
    #[arg(long, default_value = "", value_parser = parse_node_port_addresses)]
    pub node_port_addresses: NodePortAddresses,
    /// Serve NodePorts on 127.0.0.1 to the node's own processes (IPv4, TCP and
    /// UDP; never `::1`), when `--node-port-addresses` selects it.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub localhost_node_ports: bool,
}

impl NodePortArguments {
    pub fn settings(&self, node_ips: &[IpAddr]) -> NodePortSettings {
        NodePortSettings {
            addresses: self.node_port_addresses.clone(),
            localhost: self.localhost_node_ports,
            node_ips: node_ips.to_vec(),
        }
    }
}

/// `ipv4` or `ipv4,ipv6` (either order, case-insensitive). IPv4 is always
/// served: the TC programs translate it whatever the setting.
fn parse_served_families(text: &str) -> Result<ServedFamilies, String> {
    let mut served = ServedFamilies {
        ipv4: false,
        ipv6: false,
    };
    for family in text.split(',').map(str::trim) {
        match family.to_ascii_lowercase().as_str() {
            "ipv4" => served.ipv4 = true,
            "ipv6" => served.ipv6 = true,
            _ => {
                return Err(format!(
                    "{family:?} is not an address family (ipv4 or ipv6)"
                ))
            }
        }
    }
    if !served.ipv4 {
        return Err(format!(
            "{text:?} leaves IPv4 out: IPv4 is always served (ipv4 or ipv4,ipv6)"
        ));
    }
    Ok(served)
}

fn parse_node_port_addresses(text: &str) -> Result<NodePortAddresses, String> {
    NodePortAddresses::parse(&[text.to_string()])
}

/// A socket address, or none when given as an empty string.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OptionalAddress(pub Option<std::net::SocketAddr>);

fn parse_optional_address(text: &str) -> Result<OptionalAddress, String> {
    if text.trim().is_empty() {
        return Ok(OptionalAddress(None));
    }
    text.trim()
        .parse()
        .map(|address| OptionalAddress(Some(address)))
        .map_err(|error| format!("{text:?} is not an address with a port (or empty): {error}"))
}

/// The flags both `run` and `standalone` take: which interfaces get programs,
/// where the pins live, the masquerade rule, the socket hooks, the map sizes.
#[derive(Debug, Args)]
pub struct DatapathArguments {
    #[arg(long, default_value = DEFAULT_PIN_DIRECTORY)]
    pub bpf_pin_dir: PathBuf,
    /// Globs (comma-separated) of pod interfaces (host side of pod veths).
    #[arg(long, default_value = DEFAULT_POD_INTERFACE_GLOBS)]
    pub pod_interfaces: String,
    /// Globs of external interfaces; default (also when empty): every
    /// non-loopback interface that is not a pod interface.
    #[arg(long)]
    pub host_interfaces: Option<String>,
    /// `skb->mark` bit of packets to masquerade.
    #[arg(long, default_value_t = crate::datapath::DEFAULT_MASQUERADE_MARK)]
    pub masquerade_mark: u32,
    /// Do not install the SWITCHYARD-POSTROUTING masquerade rule.
    #[arg(long)]
    pub no_masquerade_rule: bool,
    /// cgroup v2 directory for the host socket hooks (default: the cgroup v2 root,
    /// so every host process of this network namespace is covered).
    #[arg(long, conflicts_with = "no_socket_hooks")]
    pub cgroup: Option<PathBuf>,
    /// Attach no socket hooks (host processes then get no Service translation).
    #[arg(long)]
    pub no_socket_hooks: bool,
    /// Pods' TCP connects to Services: pointed at a backend by the connect hook
    /// (`tcp`), or translated per packet by the TC programs (`disabled`, for
    /// meshes that must see the Service address). UDP, session affinity,
    /// masquerading and Services without endpoints always use the TC programs.
    #[arg(long, value_enum, default_value_t = PodConnectBalancing::Tcp)]
    pub pod_connect_time_load_balancing: PodConnectBalancing,
    /// Address families whose Services are served: `ipv4` (the default) or
    /// `ipv4,ipv6`. Only `ipv4` is complete today: with `ipv4,ipv6` the maps
    /// also hold dual-stack and IPv6 Services and the IPv6 socket hooks serve
    /// them to the node's own processes, but the TC programs still pass every
    /// IPv6 packet untranslated (pods, NodePorts and clients outside the node get
    /// no IPv6 Service), so keep the default on clusters with IPv6 Services
    /// (issue 25). IPv4-mapped addresses on IPv6 sockets are IPv4.
    #[arg(long, default_value = "ipv4", value_parser = parse_served_families)]
    pub served_families: ServedFamilies,
    #[command(flatten)]
    pub map_sizes: MapSizeArguments,
}

impl DatapathArguments {
    pub fn options(&self) -> DatapathOptions {
        DatapathOptions {
            pin_directory: self.bpf_pin_dir.clone(),
            map_sizes: self.map_sizes.map_sizes(),
            pod_interfaces: self.pod_interfaces(),
            host_interfaces: self.host_interfaces(),
            masquerade_mark: self.masquerade_mark,
            manage_masquerade_rule: !self.no_masquerade_rule,
            socket_hook_cgroup: self.socket_hook_cgroup(),
            pod_connect_balancing: self.pod_connect_time_load_balancing,
            served_families: self.served_families,
        }
    }

    pub fn pod_interfaces(&self) -> Globs {
        Globs::parse(&self.pod_interfaces)
    }

    pub fn host_interfaces(&self) -> Option<Globs> {
        self.host_interfaces
            .as_deref()
            .filter(|globs| !globs.is_empty())
            .map(Globs::parse)
    }

    pub fn socket_hook_cgroup(&self) -> SocketHookCgroup {
        if self.no_socket_hooks {
            return SocketHookCgroup::None;
        }
        match &self.cgroup {
            Some(path) => SocketHookCgroup::Path(path.clone()),
            None => SocketHookCgroup::Root,
        }
    }
}

/// Entries of the maps the agent creates (maps pinned by an earlier process are
/// reused as they are). Both commands take them: a node with more Services or
/// flows than the defaults hold needs larger maps in either.
#[derive(Debug, Args)]
pub struct MapSizeArguments {
    #[arg(long, default_value_t = crate::loader::MapSizes::default().frontends)]
    pub frontends_map_size: u32,
    #[arg(long, default_value_t = crate::loader::MapSizes::default().backend_slots)]
    pub backends_map_size: u32,
    #[arg(long, default_value_t = crate::loader::MapSizes::default().conntrack)]
    pub conntrack_map_size: u32,
    /// Entries of the LRU that takes new flows while the conntrack hash is full.
    #[arg(long, default_value_t = crate::loader::MapSizes::default().conntrack_overflow)]
    pub conntrack_overflow_map_size: u32,
}

impl MapSizeArguments {
    pub fn map_sizes(&self) -> crate::loader::MapSizes {
        crate::loader::MapSizes {
            frontends: self.frontends_map_size,
            backend_slots: self.backends_map_size,
            conntrack: self.conntrack_map_size,
            conntrack_overflow: self.conntrack_overflow_map_size,
            ..crate::loader::MapSizes::default()
        }
    }
}

/// `1s`, `500ms`, `2m`, or a plain number of seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, unit) = match text.find(|character: char| !character.is_ascii_digit()) {
        Some(index) => text.split_at(index),
        None => (text, "s"),
    };
    let value: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration (like 1s or 500ms)"))?;
    match unit {
        "ms" => Ok(Duration::from_millis(value)),
        "s" => Ok(Duration::from_secs(value)),
        "m" => Ok(Duration::from_secs(value * 60)),
        _ => Err(format!("{text:?}: unknown unit {unit:?} (ms, s or m)")),
    }
}

impl RunArguments {
    pub fn options(&self) -> crate::cluster::ClusterOptions {
        crate::cluster::ClusterOptions {
            node_name: self.node_name.clone(),
            datapath: self.datapath.options(),
            metrics_address: self.metrics_address,
            min_sync_period: self.min_sync_period,
            gate_timeout: self.gate_timeout,
            agent_revision: self
                .agent_revision
                .clone()
                .filter(|revision| !revision.is_empty()),
            kube_proxy_healthz: self.kube_proxy_healthz.clone(),
            coexistence_interval: self.coexistence_interval,
            kube_proxy_absence_confirmation: self.kube_proxy_absence_confirmation,
            serve_replacement_healthz: !self.no_replacement_healthz,
            replacement_healthz_port: self.replacement_healthz_port,
            kube_proxy_metrics_address: self.kube_proxy_metrics_address.0,
            node_ports: self.node_ports.settings(&[]),
        }
    }
}

#[derive(Debug, Args)]
pub struct StandaloneArguments {
    /// A YAML file or a directory of them (Services, EndpointSlices, DataplaneNode).
    #[arg(long)]
    pub manifests: PathBuf,
    #[command(flatten)]
    pub datapath: DatapathArguments,
    #[command(flatten)]
    pub node_ports: NodePortArguments,
    /// The node's addresses (repeatable), as a Node's InternalIPs would be:
    /// NodePorts are served on them too, and the first of a family is the
    /// primary one (`--node-port-addresses primary`).
    #[arg(long = "node-ip")]
    pub node_ips: Vec<IpAddr>,
    /// This node's name: which endpoints are local, which DataplaneNode to follow.
    #[arg(long, env = "NODE_NAME")]
    pub node_name: Option<String>,
    /// Remove programs, links and maps on exit (default: leave them serving).
    #[arg(long)]
    pub detach_on_exit: bool,
    /// Minimum time between two applies, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    pub min_sync_period_ms: u64,
    /// How often the manifests and interfaces are checked, in milliseconds.
    #[arg(long, default_value_t = 200)]
    pub poll_interval_ms: u64,
}

/// The pin directory alone (`detach`, `mount-bpf-fs`).
#[derive(Debug, Args)]
pub struct DetachArguments {
    #[arg(long, default_value = DEFAULT_PIN_DIRECTORY)]
    pub bpf_pin_dir: PathBuf,
}

/// The host name, as the node name defaults to it (kubelet does the same).
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_string())
        .unwrap_or_default()
}

impl StandaloneArguments {
    pub fn options(&self) -> StandaloneOptions {
        StandaloneOptions {
            manifests: self.manifests.clone(),
            datapath: self.datapath.options(),
            node_ports: self.node_ports.settings(&self.node_ips),
            node_name: self.node_name.clone().unwrap_or_else(host_name),
            detach_on_exit: self.detach_on_exit,
            min_sync_period: Duration::from_millis(self.min_sync_period_ms),
            poll_interval: Duration::from_millis(self.poll_interval_ms),
            gate_timeout: Duration::from_secs(30),
        }
    }
}

#[cfg(test)]
mod tests;
