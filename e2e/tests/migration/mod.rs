//! The migration scenarios, one module each, and the harness that runs them in order on one
//! cluster ([`harness`]).

pub mod argo_cd;
pub mod checks;
pub mod harness;
pub mod kubernetes_service;
pub mod never_ready;
pub mod not_patchable;
pub mod operator_killed;
pub mod parity;
pub mod parity_services;
pub mod rollback;
pub mod to_ebpf;
pub mod upgrade;
