//! The pod runner: hollow kubelets run no containers, so for pods whose image
//! is in the image table the runner runs the real program inside the pod's node
//! (its network and mount namespaces), with the pod's arguments, environment
//! and service-account credentials: a local binary as a plain process, or the
//! container from its OCI image with an OCI runtime, its securityContext and its
//! volumes ([`container`]).
//!
//! [`spec`], [`plan`] and [`container`] are pure; [`image_store`] unpacks images,
//! [`bundle`] writes a start's OCI bundle, and the binary
//! `switchyard-e2e-pod-runner` does the rest of the I/O.

pub mod bundle;
pub mod container;
pub mod events;
pub mod image_store;
pub mod plan;
pub mod spec;
