//! Switchyard's node agent: loads the TC NAT programs, keeps their maps in sync with
//! the Services of the cluster (or of manifest files in standalone mode), and reports
//! what it does. See `docs/datapath.md` for the datapath design.
//!
//! Layout:
//! - `error`: the crate's one error enum.
//! - `maps`: the `ServiceMaps` trait (what the syncer needs from the BPF maps), an
//!   in-memory fake with fault injection for tests.
//! - `model`, `desired`, `diff`: Kubernetes objects -> internal model -> desired map
//!   entries (pure) -> ordered update/delete/prune plan (pure).
//! - `gate`: the start-of-day gate (nothing is written before every input is in).
//! - `sync`: applying plans, the syncer (full and partial syncs), coalescing.
//! - `cli`: the command line.
//! - `loader`: aya loading, pinning, attaching, the real `ServiceMaps`.
//! - `standalone`: `switchyard-agent standalone`.
//! - `cluster`: `switchyard-agent run`, the agent in a cluster.
//! - `priority`: the agent's CPU priority while it catches up after a restart.
//! - `kube_proxy`: coexistence with kube-proxy: cleanup of its rules, chain order,
//!   its health endpoints.

pub mod cli;
pub mod cluster;
pub mod core;
pub mod datapath;
pub mod error;
pub mod host;
pub mod interfaces;
pub mod kube_proxy;
pub mod masquerade;
pub mod priority;
pub mod standalone;

pub use error::Error;
pub use switchyard_loader as loader;
pub use switchyard_model::{desired, diff, follow, gate, maps, model, sync};
