//! Switchyard's node-agent core, pure: no aya, kube or tokio beneath it, so that
//! `cargo test -p switchyard-model` runs in seconds without the BPF toolchain.
//!
//! - `model`: Kubernetes Services and EndpointSlices -> the agent's model.
//! - `desired` (with `layout`): the model -> desired map entries.
//! - `diff`: desired against current -> an ordered update/delete plan.
//! - `maps`: the `ServiceMaps` trait the syncer writes through (the loader
//!   implements it over the pinned BPF maps; `testing` adds an in-memory fake
//!   with fault injection).
//! - `sync`: applying plans, the syncer, incremental (partial) syncs, the inputs
//!   that say which Services changed, coalescing.
//! - `gate`: the start-of-day gate (nothing is written before every input is in).
//! - `follow`: following the DataplaneNode's mode (attach, drain, detach).
//! - `disruption`: the disruption signals' windows and baseline from counter samples.
//! - `error`: the map error, and [`error::chain`] for logging any error with
//!   its causes.

pub mod desired;
pub mod diff;
pub mod disruption;
pub mod error;
pub mod follow;
pub mod gate;
pub mod maps;
pub mod model;
pub mod sync;

pub use error::Error;
