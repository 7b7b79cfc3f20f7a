//! The Switchyard operator: sequences dataplane transitions between kube-proxy and Switchyard's
//! eBPF datapath.
//!
//! [`planner`] is the pure heart: from a snapshot of the cluster it decides the next safe step.
//! The controller that fills the snapshot and applies the plan comes with the operator issue.

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
