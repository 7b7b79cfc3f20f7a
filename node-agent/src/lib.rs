//! Switchyard's node agent: loads the TC NAT programs, keeps their maps in sync with
//! the Services of the cluster (or of manifest files in standalone mode), and reports
//! what it does. See `docs/datapath.md` for the datapath design.
//!
//! Three crates, so that Cargo keeps the direction of dependencies:
//! - `switchyard-model` (`node-agent/model`): the pure core, no aya, kube or
//!   tokio beneath it: model, desired state, layout, diff, apply and the
//!   syncer (full and partial syncs), the start-of-day gate, mode following.
//!   Re-exported here as `model`, `desired`, `diff`, `maps`, `sync`, `gate`,
//!   `follow`.
//! - `switchyard-loader` (`node-agent/loader`, re-exported as `loader`): aya
//!   loading, pins, attaching, the map schema and its migrations, the pinned
//!   `ServiceMaps`, the one netlink socket.
//! - this crate, the agent:
//!   - `core`: one state machine for both modes, fed by `Input`s, with the pure
//!     pieces it reads and reports through (`node`, `store`, `health`,
//!     `status`) and the per-round report the shells write out (`round`);
//!   - `datapath`: the one datapath trait the core drives and its kernel
//!     implementation; `interfaces`, `masquerade`: what both modes use of the
//!     host; `host`: the netlink input source both modes run;
//!   - `standalone`: `switchyard-agent standalone`, the manifest files as an
//!     input source; `cluster`: `switchyard-agent run`, the API watches, the
//!     kube-proxy coexistence loop, metrics and status writes;
//!   - `disruption`: the disruption signals (datapath counters sampled into the windows
//!     the DataplaneNode status and the metrics report);
//!   - `kube_proxy`: coexistence with kube-proxy (cleanup of its rules, chain
//!     order, its health endpoints); `priority`: the CPU priority while the
//!     agent catches up after a restart; `cli`, `error`.

pub mod cli;
pub mod cluster;
pub mod core;
pub mod datapath;
pub mod disruption;
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
