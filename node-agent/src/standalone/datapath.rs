//! "The datapath" as standalone mode drives it: one small trait, so the wiring to
//! the loader is in one place ([`KernelDatapath`]).

use std::path::PathBuf;

use switchyard_common::{DatapathConfig, DATAPATH_MODE_ACTIVE};

use super::interfaces::InterfaceRole;
use super::{PodConnectBalancing, SocketHookCgroup};
use crate::loader::{self, InterfaceKind, LoaderSettings, PinnedServiceMaps};
use crate::maps::ServiceMaps;
use crate::Error;

/// Source address of hairpinned flows (a pod reaching a Service that picks that
/// same pod): link-local, so it is never a real peer.
pub const DEFAULT_HAIRPIN_ADDRESS: [u8; 4] = [169, 254, 42, 1];
/// `skb->mark` bit for packets to masquerade (kube-proxy's `KUBE-MARK-MASQ` bit, so
/// that kube-proxy's own POSTROUTING rule masquerades them too while it runs).
pub const DEFAULT_MASQUERADE_MARK: u32 = 0x4000;

pub trait Datapath {
    type Maps: ServiceMaps;
    fn maps(&mut self) -> &mut Self::Maps;
    /// Attaches (or keeps) the programs on one interface: idempotent.
    fn attach_interface(&mut self, name: &str, role: InterfaceRole) -> Result<(), Error>;
    fn attach_socket_hooks(&mut self) -> Result<(), Error>;
    fn detach_interface(&mut self, name: &str) -> Result<(), Error>;
    /// Interfaces (by index) that have this agent's programs, e.g. from a
    /// previous process.
    fn attached_interfaces(&self) -> Result<Vec<u32>, Error>;
    fn live_tcp_flows(&self) -> Result<usize, Error>;
    fn network_namespace_cookie(&self) -> Result<u64, Error>;
    /// Removes every program, link and map pin (`--detach-on-exit`).
    fn detach_everything(&mut self) -> Result<(), Error>;
    /// Once the programs are attached: ends a map schema migration (the old
    /// version's pins are removed only when nothing uses them any more).
    fn finish_migration(&mut self) -> Result<(), Error> {
        Ok(())
    }
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

pub fn is_active(config: Option<&DatapathConfig>) -> bool {
    config.is_some_and(|config| config.mode == DATAPATH_MODE_ACTIVE)
}

/// The real datapath: aya programs and pinned maps.
pub struct KernelDatapath {
    datapath: loader::Datapath,
    maps: PinnedServiceMaps,
    pin_directory: PathBuf,
}

impl KernelDatapath {
    pub fn load(
        pin_directory: PathBuf,
        cgroup: &SocketHookCgroup,
        map_sizes: loader::MapSizes,
    ) -> Result<Self, Error> {
        let defaults = LoaderSettings::default();
        let settings = LoaderSettings {
            pin_directory: pin_directory.clone(),
            map_sizes,
            cgroup_path: match cgroup {
                SocketHookCgroup::Root => defaults.cgroup_path.clone(),
                SocketHookCgroup::Path(path) => Some(path.clone()),
                SocketHookCgroup::None => None,
            },
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

impl Datapath for KernelDatapath {
    type Maps = PinnedServiceMaps;

    fn maps(&mut self) -> &mut PinnedServiceMaps {
        &mut self.maps
    }

    fn attach_interface(&mut self, name: &str, role: InterfaceRole) -> Result<(), Error> {
        let kind = match role {
            InterfaceRole::Pod => InterfaceKind::Pod,
            InterfaceRole::Host => InterfaceKind::Host,
        };
        self.datapath.attach_interface(name, kind).map(|_| ())
    }

    fn attach_socket_hooks(&mut self) -> Result<(), Error> {
        self.datapath.attach_socket_hooks().map(|_| ())
    }

    fn detach_interface(&mut self, name: &str) -> Result<(), Error> {
        self.datapath.detach_interface(name)
    }

    fn attached_interfaces(&self) -> Result<Vec<u32>, Error> {
        self.datapath.attached_interfaces()
    }

    fn live_tcp_flows(&self) -> Result<usize, Error> {
        self.maps.live_tcp_flows()
    }

    fn network_namespace_cookie(&self) -> Result<u64, Error> {
        loader::system::network_namespace_cookie().map_err(|error| Error::LoadPrograms {
            reason: format!("cannot read the network namespace cookie: {error}"),
        })
    }

    fn detach_everything(&mut self) -> Result<(), Error> {
        loader::detach_everything(&self.pin_directory)
    }

    fn finish_migration(&mut self) -> Result<(), Error> {
        self.datapath.finish_migration()
    }
}
