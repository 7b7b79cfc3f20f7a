//! The pod runner: hollow kubelets run no containers, so for pods whose image
//! is in the image table the runner runs the real binary inside the pod's node
//! (its network and mount namespaces), with the pod's arguments, environment
//! and service-account credentials.
//!
//! [`spec`] and [`plan`] are pure; the binary `switchyard-e2e-pod-runner` does
//! the I/O.

pub mod events;
pub mod plan;
pub mod spec;
