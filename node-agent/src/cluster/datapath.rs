//! The datapath as cluster mode drives it: the standalone mode's operations plus
//! what the metrics need (whether an attach changed the kernel, the per-CPU
//! counters). One trait, so the agent's logic runs against an in-memory fake in
//! tests and against the loader ([`KernelDatapath`]) in the DaemonSet.

use std::path::PathBuf;

use crate::loader::PinnedServiceMaps;
use crate::loader::{self, AttachOutcome, Counters, InterfaceKind, LoaderSettings, MapSizes};
use crate::maps::ServiceMaps;
use crate::standalone::interfaces::InterfaceRole;
use crate::Error;

pub trait NodeDatapath {
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
    /// Once the programs are attached: ends a map schema migration.
    fn finish_migration(&mut self) -> Result<(), Error>;
    /// The programs' per-CPU counters, summed.
    fn counters(&self) -> Result<Counters, Error>;
    /// Installs the agent's masquerade rule for packets carrying `mark`
    /// (idempotent): netfilter, kept behind the trait so the agent's decision of
    /// when is tested against the fake.
    fn ensure_masquerade_rule(&mut self, mark: u32) -> Result<(), Error>;
    /// What the conntrack expiry has done, once it has swept (none in fakes).
    fn conntrack_sweep_report(&self) -> Option<loader::expiry::SweepReport> {
        None
    }
}

/// Where the socket hooks go (see `standalone::SocketHookCgroup`).
pub use crate::standalone::SocketHookCgroup;

/// The real datapath: the loader's programs and pinned maps.
pub struct KernelDatapath {
    datapath: loader::Datapath,
    maps: PinnedServiceMaps,
}

impl KernelDatapath {
    pub fn load(
        pin_directory: PathBuf,
        map_sizes: MapSizes,
        cgroup: &SocketHookCgroup,
    ) -> Result<Self, Error> {
        let defaults = LoaderSettings::default();
        let settings = LoaderSettings {
            pin_directory,
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
        Ok(Self { datapath, maps })
    }
}

fn changed(outcomes: &[AttachOutcome]) -> bool {
    outcomes
        .iter()
        .any(|outcome| *outcome != AttachOutcome::Kept)
}

impl NodeDatapath for KernelDatapath {
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

    fn finish_migration(&mut self) -> Result<(), Error> {
        self.datapath.finish_migration()
    }

    fn counters(&self) -> Result<Counters, Error> {
        self.maps.counters()
    }

    fn ensure_masquerade_rule(&mut self, mark: u32) -> Result<(), Error> {
        crate::standalone::masquerade::ensure(mark)
    }

    fn conntrack_sweep_report(&self) -> Option<loader::expiry::SweepReport> {
        self.datapath.conntrack_sweep_report()
    }
}
