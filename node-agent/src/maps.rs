//! What the syncer needs from the BPF maps, behind a trait so that the pure parts
//! of the agent are tested against an in-memory fake (with injected faults), and
//! the real implementation (`loader`) stays a thin layer over aya.

use std::collections::BTreeMap;

use switchyard_common::{BackendSlotKey, BackendValue, DatapathConfig, FrontendKey, FrontendValue};

use crate::Error;

/// The Service maps as the syncer sees them.
pub trait ServiceMaps {
    /// Every frontend entry currently in the map (used to restore state at start).
    fn frontends(&self) -> Result<BTreeMap<FrontendKey, FrontendValue>, Error>;
    /// Every backend slot entry currently in the map.
    fn backend_slots(&self) -> Result<BTreeMap<BackendSlotKey, BackendValue>, Error>;
    fn write_frontend(&mut self, key: &FrontendKey, value: &FrontendValue) -> Result<(), Error>;
    fn delete_frontend(&mut self, key: &FrontendKey) -> Result<(), Error>;
    fn write_backend_slot(
        &mut self,
        key: &BackendSlotKey,
        value: &BackendValue,
    ) -> Result<(), Error>;
    fn delete_backend_slot(&mut self, key: &BackendSlotKey) -> Result<(), Error>;
    /// The datapath configuration entry, if it has been written.
    fn config(&self) -> Result<Option<DatapathConfig>, Error>;
    fn write_config(&mut self, config: &DatapathConfig) -> Result<(), Error>;
}
