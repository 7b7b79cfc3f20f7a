//! Switchyard's end-to-end harness: a real local Kubernetes 1.20 cluster
//! (`e2e/cluster`), the pod runner that gives hollow nodes real processes, and
//! the helpers tests use inside the cluster: clients, waiting, network
//! namespaces and traffic.

pub mod audit;
pub mod cluster;
pub mod error;
pub mod images;
pub mod netns;
pub mod objects;
pub mod pod_runner;
pub mod traffic;
pub mod wait;

pub use error::{E2eError, Result};
