//! The Switchyard operator: sequences dataplane transitions between kube-proxy and Switchyard's
//! eBPF datapath.
//!
//! [`planner`] is the pure heart: from a snapshot of the cluster it decides the next safe step,
//! and what it decides is all the operator writes. [`controller`] watches the cluster, takes the
//! snapshot, applies the plan and publishes the status; [`events`] words what it did.

pub mod cache;
pub mod client;
pub mod controller;
pub mod crd_apply;
pub mod error;
pub mod error_policy;
pub mod events;
pub mod kube_proxy;
pub mod leader;
pub mod metrics;
pub mod planner;
pub mod snapshot;

pub use error::Error;
