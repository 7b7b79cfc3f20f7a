//! The in-memory datapath both modes' tests drive the core with.

use std::collections::{BTreeMap, BTreeSet};

use switchyard_common::FRONTEND_FLAG_MASQUERADE_REMOTE;
use switchyard_loader::Counters;
use switchyard_model::maps::FakeServiceMaps;

use super::Datapath;
use crate::interfaces::InterfaceRole;
use crate::Error;

#[derive(Default)]
pub(crate) struct FakeDatapath {
    pub maps: FakeServiceMaps,
    /// Interfaces with programs, by name.
    pub attached: BTreeMap<String, InterfaceRole>,
    pub attach_calls: usize,
    pub socket_hooks: bool,
    pub live_flows: usize,
    pub detached_everything: bool,
    /// Interfaces whose detach fails.
    pub failing_detaches: BTreeSet<String>,
    /// One entry per masquerade rule installed: whether the maps already held a
    /// frontend flagged for masquerading at that moment.
    pub masquerade_installs: Vec<bool>,
    /// Called on every access to the maps, inside the core's step that makes it: a test holds
    /// the agent in the middle of a sync here (a map write wedged in the kernel, say).
    pub on_maps_access: Option<Box<dyn FnMut() + Send>>,
}

impl Datapath for FakeDatapath {
    type Maps = FakeServiceMaps;
    fn maps(&mut self) -> &mut FakeServiceMaps {
        if let Some(on_maps_access) = &mut self.on_maps_access {
            on_maps_access();
        }
        &mut self.maps
    }
    fn attach_interface(&mut self, name: &str, role: InterfaceRole) -> Result<bool, Error> {
        self.attach_calls += 1;
        Ok(self.attached.insert(name.to_string(), role).is_none())
    }
    fn attach_socket_hooks(&mut self) -> Result<bool, Error> {
        let changed = !self.socket_hooks;
        self.socket_hooks = true;
        Ok(changed)
    }
    fn detach_interface(&mut self, name: &str) -> Result<(), Error> {
        if self.failing_detaches.contains(name) {
            return Err(Error::Loader(switchyard_loader::Error::DetachProgram {
                target: name.into(),
                source: "device or resource busy".into(),
            }));
        }
        self.attached.remove(name);
        Ok(())
    }
    fn attached_interfaces(&self) -> Result<Vec<u32>, Error> {
        Ok((1..=self.attached.len() as u32).collect())
    }
    fn live_tcp_flows(&self) -> Result<usize, Error> {
        Ok(self.live_flows)
    }
    fn network_namespace_cookie(&self) -> Result<u64, Error> {
        Ok(4096)
    }
    fn finish_migration(&mut self) -> Result<(), Error> {
        Ok(())
    }
    fn counters(&self) -> Result<Counters, Error> {
        Ok(Counters::default())
    }
    fn ensure_masquerade_rule(&mut self, _mark: u32) -> Result<(), Error> {
        let flagged_already = self
            .maps
            .state
            .frontends
            .values()
            .any(|frontend| frontend.flags & FRONTEND_FLAG_MASQUERADE_REMOTE != 0);
        self.masquerade_installs.push(flagged_already);
        Ok(())
    }
    fn detach_everything(&mut self) -> Result<(), Error> {
        self.attached.clear();
        self.socket_hooks = false;
        self.detached_everything = true;
        Ok(())
    }
}
