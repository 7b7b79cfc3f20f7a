//! Changes of the Services and EndpointSlices the agent watches, already in the
//! internal model. Watch events arrive as [`StoreChange`]s; a (re)list arrives as
//! one `Replace` built by the watcher task only once the list is complete
//! (`InitDone`), so the syncer never sees half a list: objects missing from a
//! partial list would otherwise be pruned from the maps. The agent keeps the
//! objects in [`crate::sync::inputs::SyncInputs`], indexed by Service, which
//! turns each change into the Services it touches.

use std::collections::BTreeMap;

use crate::model::ServiceName;

/// One change of a watched collection, keyed by namespace and name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreChange<V> {
    /// A complete list: everything else is gone.
    Replace(BTreeMap<ServiceName, V>),
    /// An object was added or changed (and is used by the datapath).
    Upsert(ServiceName, V),
    /// An object was deleted, or changed into one the datapath does not use.
    Remove(ServiceName),
}
