//! Topology-aware routing: which ready endpoints the cluster-wide view keeps,
//! from the endpoints' hints and this node's name and zone.
//!
//! Followed: kube-proxy's current `pkg/proxy/topology.go` (1.33 and later,
//! `topologyModeFromHints` and `availableForTopology`, with
//! PreferSameTrafficDistribution on, as it is by default from 1.34):
//! - Only ready endpoints are looked at, and only for the cluster-wide view; a
//!   `Local` policy's view and the fall-back to serving terminating endpoints
//!   never use hints.
//! - Same node: if every ready endpoint has a `hints.forNodes` and one of them
//!   names this node, only the ready endpoints hinted for this node are used.
//! - Otherwise same zone: if every ready endpoint has a `hints.forZones` and one
//!   of them names this node's zone (its `topology.kubernetes.io/zone` label; a
//!   node without one matches nothing), only the ready endpoints hinted for that
//!   zone.
//! - Otherwise every ready endpoint. There is no fall-back inside a mode: a mode
//!   is only chosen when it keeps at least one endpoint.
//!
//! The hints are all kube-proxy reads: `trafficDistribution` (`PreferClose`,
//! `PreferSameZone`, `PreferSameNode`) and the `service.kubernetes.io/topology-mode`
//! annotation are read by the EndpointSlice controller, which writes the hints;
//! since 1.30 kube-proxy uses hints whatever the annotation says (1.21-1.29 also
//! required the annotation; the controller only wrote hints where it was set).

use crate::model::TopologyHints;

use super::{Candidate, NodeView};

/// An endpoint's hints, borrowed from its model.
#[derive(Clone, Copy, Debug)]
pub(super) struct Hints<'a> {
    zones: &'a [String],
    nodes: &'a [String],
}

impl<'a> Hints<'a> {
    pub(super) fn of(hints: &'a TopologyHints) -> Self {
        Self {
            zones: &hints.zones,
            nodes: &hints.nodes,
        }
    }

    /// The hints of an endpoint listed by several slices (while it moves from
    /// one to another): a copy with hints wins over one without, per kind.
    pub(super) fn merged(self, other: Self) -> Self {
        Self {
            zones: if self.zones.is_empty() {
                other.zones
            } else {
                self.zones
            },
            nodes: if self.nodes.is_empty() {
                other.nodes
            } else {
                self.nodes
            },
        }
    }

    fn names_node(&self, node: &NodeView) -> bool {
        !node.name.is_empty() && self.nodes.contains(&node.name)
    }

    fn names_zone(&self, node: &NodeView) -> bool {
        node.zone
            .as_deref()
            .filter(|zone| !zone.is_empty())
            .is_some_and(|zone| self.zones.iter().any(|name| name == zone))
    }
}

/// Which ready endpoints the cluster-wide view keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Every ready endpoint (no usable hints).
    Every,
    /// Those hinted for this node.
    SameNode,
    /// Those hinted for this node's zone.
    SameZone,
}

impl Mode {
    pub(super) fn admits(self, hints: Hints<'_>, node: &NodeView) -> bool {
        match self {
            Mode::Every => true,
            Mode::SameNode => hints.names_node(node),
            Mode::SameZone => hints.names_zone(node),
        }
    }
}

/// The mode the hints of a Service port's endpoints allow on `node`.
pub(super) fn mode(candidates: &[Candidate<'_>], node: &NodeView) -> Mode {
    let ready = || candidates.iter().filter(|candidate| candidate.ready);
    if ready().next().is_none() {
        return Mode::Every;
    }
    let every_ready = |has: fn(&Hints<'_>) -> bool| ready().all(|candidate| has(&candidate.hints));
    if every_ready(|hints| !hints.nodes.is_empty())
        && ready().any(|candidate| candidate.hints.names_node(node))
    {
        return Mode::SameNode;
    }
    if every_ready(|hints| !hints.zones.is_empty())
        && ready().any(|candidate| candidate.hints.names_zone(node))
    {
        return Mode::SameZone;
    }
    Mode::Every
}

#[cfg(test)]
mod tests;
