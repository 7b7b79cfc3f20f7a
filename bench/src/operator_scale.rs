//! Operator scale: the operator against a local API server with Node and
//! DataplaneNode objects created directly and simulated agents.

use std::path::Path;

use crate::error::Result;
use crate::report::{Summary, Table};
use crate::systems::Binaries;
use crate::Plan;

pub async fn run(
    _plan: &Plan,
    _binaries: &Binaries,
    _work: &Path,
    _summary: &mut Summary,
    _tables: &mut Vec<Table>,
) -> Result<()> {
    println!("operator scale: not written yet");
    Ok(())
}

pub async fn simulated_agents(_seed: u64) -> Result<()> {
    Ok(())
}
