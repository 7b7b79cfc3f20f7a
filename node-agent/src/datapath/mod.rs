//! The datapath as the agent drives it, in both modes: one trait, so the core's
//! logic runs against an in-memory fake in tests and against the loader
//! ([`KernelDatapath`]) on a node, and the settings of the programs' config
//! entry (hairpin address, masquerade mark, pod connect balancing).

use std::path::PathBuf;

use switchyard_common::DatapathConfig;
use switchyard_loader::expiry::SweepReport;
use switchyard_loader::{
    self as loader, AttachOutcome, Counters, InterfaceKind, LoaderSettings, MapSizes,
    PinnedServiceMaps,
};
use switchyard_model::maps::ServiceMaps;

use crate::interfaces::InterfaceRole;
use crate::Error;

/// Source address of hairpinned flows (a pod reaching a Service that picks that
/// same pod): link-local, so it is never a real peer.
pub const DEFAULT_HAIRPIN_ADDRESS: [u8; 4] = [169, 254, 42, 1];
/// `skb->mark` bit for packets to masquerade (kube-proxy's `KUBE-MARK-MASQ` bit, so
/// that kube-proxy's own POSTROUTING rule masquerades them too while it runs).
pub const DEFAULT_MASQUERADE_MARK: u32 = 0x4000;

/// Whether the socket hooks point pods' TCP connects to Services at a backend
/// (`--pod-connect-time-load-balancing`), as Calico's eBPF dataplane and
/// Cilium's socket load balancer do by default: a connection whose socket is
/// connected to the backend itself needs no per-packet translation, no
/// connection tracking entry, and survives any later change of dataplane.
/// `disabled` leaves pods' traffic to the TC programs, for meshes and tools that
/// must see the Service address in the packets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum PodConnectBalancing {
    Disabled,
    #[default]
    Tcp,
}

impl PodConnectBalancing {
    /// Its value in `DatapathConfig::pod_connect_balancing`.
    pub fn config_value(self) -> u32 {
        match self {
            PodConnectBalancing::Disabled => switchyard_common::POD_CONNECT_BALANCING_DISABLED,
            PodConnectBalancing::Tcp => switchyard_common::POD_CONNECT_BALANCING_TCP,
        }
    }
}

/// Where the host socket hooks go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SocketHookCgroup {
    /// The cgroup v2 root: every process of the node.
    Root,
    Path(PathBuf),
    None,
}

/// How the datapath is set up on this node, the same in both modes (the
/// `DatapathArguments` of the command line).
#[derive(Clone, Debug)]
pub struct DatapathOptions {
    pub pin_directory: PathBuf,
    pub map_sizes: MapSizes,
    pub pod_interfaces: crate::interfaces::Globs,
    /// `None`: every non-loopback interface that is not a pod interface.
    pub host_interfaces: Option<crate::interfaces::Globs>,
    pub masquerade_mark: u32,
    /// Install the agent's masquerade rule (off in environments without iptables).
    pub manage_masquerade_rule: bool,
    pub socket_hook_cgroup: SocketHookCgroup,
    pub pod_connect_balancing: PodConnectBalancing,
    /// The address families served (`--served-families`): which Services'
    /// addresses the maps hold, and whether the IPv6 socket hooks are attached.
    pub served_families: switchyard_model::model::ServedFamilies,
}

/// The config entry for `mode` (a `DATAPATH_MODE_*`).
pub fn datapath_config(
    mode: u32,
    cookie: u64,
    masquerade_mark: u32,
    pod_connect_balancing: PodConnectBalancing,
) -> DatapathConfig {
    DatapathConfig {
        hairpin_address: switchyard_common::ipv4_mapped(DEFAULT_HAIRPIN_ADDRESS),
        network_namespace_cookie: cookie,
        mode,
        masquerade_mark,
        // Zero means the programs' defaults (6 h, 10 s, 120 s).
        tcp_idle_timeout_seconds: 0,
        tcp_closing_timeout_seconds: 0,
        udp_idle_timeout_seconds: 0,
        pod_connect_balancing: pod_connect_balancing.config_value(),
    }
}

pub trait Datapath {
    type Maps: ServiceMaps;
    fn maps(&mut self) -> &mut Self::Maps;
    /// Attaches (or keeps) the programs on one interface: idempotent. Returns
    /// whether the kernel changed (a link created or its program replaced); an
    /// agent restart with the same programs changes nothing.
    fn attach_interface(&mut self, name: &str, role: InterfaceRole) -> Result<bool, Error>;
    /// The host socket hooks (idempotent, like interfaces).
    fn attach_socket_hooks(&mut self) -> Result<bool, Error>;
    fn detach_interface(&mut self, name: &str) -> Result<(), Error>;
    /// Interfaces (by index) with this agent's programs, e.g. from a previous process.
    fn attached_interfaces(&self) -> Result<Vec<u32>, Error>;
    fn live_tcp_flows(&self) -> Result<usize, Error>;
    fn network_namespace_cookie(&self) -> Result<u64, Error>;
    /// Once the programs are attached: ends a map schema migration (the old
    /// version's pins are removed only when nothing uses them any more).
    fn finish_migration(&mut self) -> Result<(), Error>;
    /// The programs' per-CPU counters, summed.
    fn counters(&self) -> Result<Counters, Error>;
    /// Installs the agent's masquerade rule for packets carrying `mark`
    /// (idempotent): netfilter, kept behind the trait so the core's decision of
    /// when is tested against the fake.
    fn ensure_masquerade_rule(&mut self, mark: u32) -> Result<(), Error>;
    /// Removes every program, link and map pin (`--detach-on-exit`).
    fn detach_everything(&mut self) -> Result<(), Error>;
    /// What the conntrack expiry has done, once it has swept (none in fakes).
    fn conntrack_sweep_report(&self) -> Option<SweepReport> {
        None
    }
}

/// The real datapath: the loader's programs and pinned maps.
pub struct KernelDatapath {
    datapath: loader::Datapath,
    maps: PinnedServiceMaps,
    pin_directory: PathBuf,
}

impl KernelDatapath {
    pub fn load(options: &DatapathOptions) -> Result<Self, Error> {
        let pin_directory = options.pin_directory.clone();
        let defaults = LoaderSettings::default();
        let settings = LoaderSettings {
            pin_directory: pin_directory.clone(),
            map_sizes: options.map_sizes,
            cgroup_path: match &options.socket_hook_cgroup {
                SocketHookCgroup::Root => defaults.cgroup_path.clone(),
                SocketHookCgroup::Path(path) => Some(path.clone()),
                SocketHookCgroup::None => None,
            },
            ipv6_socket_hooks: options.served_families.ipv6,
            ..defaults
        };
        let datapath = loader::Datapath::load(settings)?;
        let maps = datapath.service_maps()?;
        Ok(Self {
            datapath,
            maps,
            pin_directory,
        })
    }
}

fn changed(outcomes: &[AttachOutcome]) -> bool {
    outcomes
        .iter()
        .any(|outcome| *outcome != AttachOutcome::Kept)
}

impl Datapath for KernelDatapath {
    type Maps = PinnedServiceMaps;

    fn maps(&mut self) -> &mut PinnedServiceMaps {
        &mut self.maps
    }

    fn attach_interface(&mut self, name: &str, role: InterfaceRole) -> Result<bool, Error> {
        let kind = match role {
            InterfaceRole::Pod => InterfaceKind::Pod,
            InterfaceRole::Host => InterfaceKind::Host,
        };
        Ok(changed(&self.datapath.attach_interface(name, kind)?))
    }

    fn attach_socket_hooks(&mut self) -> Result<bool, Error> {
        Ok(changed(&self.datapath.attach_socket_hooks()?))
    }

    fn detach_interface(&mut self, name: &str) -> Result<(), Error> {
        Ok(self.datapath.detach_interface(name)?)
    }

    fn attached_interfaces(&self) -> Result<Vec<u32>, Error> {
        Ok(self.datapath.attached_interfaces()?)
    }

    fn live_tcp_flows(&self) -> Result<usize, Error> {
        Ok(self.maps.live_tcp_flows()?)
    }

    fn network_namespace_cookie(&self) -> Result<u64, Error> {
        loader::system::network_namespace_cookie()
            .map_err(|source| Error::Loader(loader::Error::ReadNetworkNamespaceCookie { source }))
    }

    fn finish_migration(&mut self) -> Result<(), Error> {
        Ok(self.datapath.finish_migration()?)
    }

    fn counters(&self) -> Result<Counters, Error> {
        Ok(self.maps.counters()?)
    }

    fn ensure_masquerade_rule(&mut self, mark: u32) -> Result<(), Error> {
        crate::masquerade::ensure(mark)
    }

    fn detach_everything(&mut self) -> Result<(), Error> {
        Ok(loader::detach_everything(&self.pin_directory)?)
    }

    fn conntrack_sweep_report(&self) -> Option<SweepReport> {
        self.datapath.conntrack_sweep_report()
    }
}

#[cfg(test)]
pub(crate) mod fake;
