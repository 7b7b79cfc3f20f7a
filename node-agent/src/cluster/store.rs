//! The agent's copy of the Services and EndpointSlices it watches, already in the
//! internal model. Watch events arrive as [`StoreChange`]s; a (re)list arrives as
//! one `Replace` built by the watcher task only once the list is complete
//! (`InitDone`), so the syncer never sees half a list: objects missing from a
//! partial list would otherwise be pruned from the maps.

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

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectStore<V> {
    objects: BTreeMap<ServiceName, V>,
    /// Whether a complete list has arrived.
    listed: bool,
}

impl<V> Default for ObjectStore<V> {
    fn default() -> Self {
        Self {
            objects: BTreeMap::new(),
            listed: false,
        }
    }
}

impl<V: PartialEq + Clone> ObjectStore<V> {
    /// Applies a change; returns whether the content changed (an update that
    /// changes nothing the model keeps, such as an annotation, returns false).
    pub fn apply(&mut self, change: StoreChange<V>) -> bool {
        match change {
            StoreChange::Replace(objects) => {
                self.listed = true;
                if self.objects == objects {
                    return false;
                }
                self.objects = objects;
                true
            }
            StoreChange::Upsert(key, value) => {
                if self.objects.get(&key) == Some(&value) {
                    return false;
                }
                self.objects.insert(key, value);
                true
            }
            StoreChange::Remove(key) => self.objects.remove(&key).is_some(),
        }
    }

    pub fn is_listed(&self) -> bool {
        self.listed
    }

    pub fn values(&self) -> Vec<V> {
        self.objects.values().cloned().collect()
    }

    pub fn len(&self) -> usize {
        self.objects.len()
    }

    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> ServiceName {
        ServiceName::new("default", name)
    }

    #[test]
    fn a_store_is_listed_only_after_a_complete_list() {
        let mut store = ObjectStore::<u32>::default();
        assert!(store.apply(StoreChange::Upsert(key("a"), 1)));
        assert!(!store.is_listed(), "a watch event is not a list");
        assert!(store.apply(StoreChange::Replace(BTreeMap::from([(key("b"), 2)]))));
        assert!(store.is_listed());
        assert_eq!(store.values(), vec![2], "the list replaced everything");
    }

    #[test]
    fn updates_that_change_nothing_report_no_change() {
        let mut store = ObjectStore::<u32>::default();
        let list = BTreeMap::from([(key("a"), 1), (key("b"), 2)]);
        assert!(store.apply(StoreChange::Replace(list.clone())));
        assert!(
            !store.apply(StoreChange::Replace(list)),
            "a relist of the same"
        );
        assert!(!store.apply(StoreChange::Upsert(key("a"), 1)));
        assert!(!store.apply(StoreChange::Remove(key("missing"))));
        assert!(store.apply(StoreChange::Upsert(key("a"), 3)));
        assert!(store.apply(StoreChange::Remove(key("b"))));
        assert_eq!(store.values(), vec![3]);
        assert_eq!(store.len(), 1);
    }
}
