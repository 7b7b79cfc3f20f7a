//! The Services the eBPF datapath does not serve yet, as the Service watch reports them.
//!
//! A cluster has tens of thousands of Services and the operator runs beside 5,000 nodes, so no
//! Service object is kept: each watch event is mapped at once to its
//! [`UnsupportedService`] summary, and only Services that have one are held (namespace, name,
//! UID and the features found). A cluster whose Services the datapath all serves holds nothing.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::watcher;

use crate::planner::UnsupportedService;

type Key = (String, String);

#[derive(Debug, Default)]
struct Findings {
    current: BTreeMap<Key, Arc<UnsupportedService>>,
    /// Filled during a relist, swapped in when it is complete (as a reflector store does), so a
    /// half-done relist never hides a Service.
    relisting: Option<BTreeMap<Key, Arc<UnsupportedService>>>,
}

/// The unsupported Services seen by the Service watch; ready once its first list is complete.
#[derive(Debug)]
pub struct UnsupportedServices {
    findings: Mutex<Findings>,
    ready: tokio::sync::watch::Sender<bool>,
}

impl Default for UnsupportedServices {
    fn default() -> Self {
        Self {
            findings: Mutex::new(Findings::default()),
            ready: tokio::sync::watch::Sender::new(false),
        }
    }
}

fn key_of(service: &Service) -> Key {
    (
        service.metadata.namespace.clone().unwrap_or_default(),
        service.metadata.name.clone().unwrap_or_default(),
    )
}

impl UnsupportedServices {
    /// Applies one watch event; returns whether what the planner reads changed (a reconcile is
    /// due). Changes of served Services change nothing here.
    pub fn apply(&self, event: &watcher::Event<Service>) -> bool {
        let mut findings = self.findings.lock().unwrap_or_else(PoisonError::into_inner);
        let changed = match event {
            watcher::Event::Apply(service) => {
                let key = key_of(service);
                match UnsupportedService::of(service) {
                    Some(found) => {
                        let found = Arc::new(found);
                        findings.current.insert(key, Arc::clone(&found)) != Some(found)
                    }
                    None => findings.current.remove(&key).is_some(),
                }
            }
            watcher::Event::Delete(service) => findings.current.remove(&key_of(service)).is_some(),
            watcher::Event::Init => {
                findings.relisting = Some(BTreeMap::new());
                false
            }
            watcher::Event::InitApply(service) => {
                if let Some(found) = UnsupportedService::of(service) {
                    findings
                        .relisting
                        .get_or_insert_with(BTreeMap::new)
                        .insert(key_of(service), Arc::new(found));
                }
                false
            }
            watcher::Event::InitDone => {
                let listed = findings.relisting.take().unwrap_or_default();
                let changed = listed != findings.current;
                findings.current = listed;
                let first = !*self.ready.borrow();
                self.ready.send_replace(true);
                changed || first
            }
        };
        changed
    }

    /// The unsupported Services now (shared, not copied).
    pub fn list(&self) -> Vec<Arc<UnsupportedService>> {
        self.findings
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .current
            .values()
            .cloned()
            .collect()
    }

    /// Whether the first list is complete.
    pub fn is_ready(&self) -> bool {
        *self.ready.borrow()
    }

    /// Waits until the first list is complete.
    pub async fn wait_until_ready(&self) {
        let mut receiver = self.ready.subscribe();
        // The sender lives as long as `self`, so the wait cannot fail while we wait.
        let _ = receiver.wait_for(|ready| *ready).await;
    }
}

/// The name of the trigger for a completed relist (no one Service changed).
const RELISTED: &str = "services-relisted";

/// What a Service watch event triggers the controller with: a Service with only the name and
/// namespace of the one that changed (`services-relisted` for a relist). kube-runtime names every
/// trigger by its object and panics on an object without a name.
pub fn trigger(event: &watcher::Event<Service>) -> Service {
    let (namespace, name) = match event {
        watcher::Event::Apply(service)
        | watcher::Event::InitApply(service)
        | watcher::Event::Delete(service) => key_of(service),
        watcher::Event::Init | watcher::Event::InitDone => (String::new(), String::new()),
    };
    Service {
        metadata: ObjectMeta {
            name: Some(name)
                .filter(|name| !name.is_empty())
                .or_else(|| Some(RELISTED.to_owned())),
            namespace: Some(namespace).filter(|namespace| !namespace.is_empty()),
            ..ObjectMeta::default()
        },
        ..Service::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ServicePort, ServiceSpec};

    fn service(name: &str, protocol: &str) -> Service {
        Service {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("shop".into()),
                uid: Some(format!("uid-{name}")),
                ..ObjectMeta::default()
            },
            spec: Some(ServiceSpec {
                cluster_ip: Some("10.96.0.20".into()),
                ports: Some(vec![ServicePort {
                    port: 80,
                    protocol: Some(protocol.into()),
                    ..ServicePort::default()
                }]),
                ..ServiceSpec::default()
            }),
            status: None,
        }
    }

    fn names(services: &UnsupportedServices) -> Vec<String> {
        services
            .list()
            .iter()
            .map(|service| service.name.clone())
            .collect()
    }

    #[test]
    fn only_unsupported_services_are_held_and_only_their_changes_are_reported() {
        let services = UnsupportedServices::default();
        assert!(!services.is_ready());
        assert!(!services.apply(&watcher::Event::Init));
        assert!(!services.apply(&watcher::Event::InitApply(service("web", "TCP"))));
        assert!(!services.apply(&watcher::Event::InitApply(service("pbx", "SCTP"))));
        assert!(
            services.list().is_empty(),
            "a relist shows when it is complete"
        );
        assert!(services.apply(&watcher::Event::InitDone));
        assert!(services.is_ready());
        assert_eq!(names(&services), ["pbx"], "a served Service is not kept");

        assert!(
            !services.apply(&watcher::Event::Apply(service("web", "UDP"))),
            "a served Service changing is no reason to plan"
        );
        assert!(!services.apply(&watcher::Event::Apply(service("pbx", "SCTP"))));
        assert!(services.apply(&watcher::Event::Apply(service("web", "SCTP"))));
        assert_eq!(names(&services), ["pbx", "web"]);
        assert!(services.apply(&watcher::Event::Apply(service("web", "TCP"))));
        assert!(services.apply(&watcher::Event::Delete(service("pbx", "SCTP"))));
        assert!(services.list().is_empty());
        assert!(!services.apply(&watcher::Event::Delete(service("pbx", "SCTP"))));
    }

    #[test]
    fn every_trigger_carries_a_name_as_the_controller_needs() {
        use kube::runtime::reflector::ObjectRef;
        for event in [
            watcher::Event::Apply(service("pbx", "SCTP")),
            watcher::Event::Delete(service("pbx", "SCTP")),
            watcher::Event::InitDone,
            watcher::Event::Apply(Service::default()),
        ] {
            let trigger = trigger(&event);
            assert!(trigger.metadata.name.is_some(), "{event:?}");
            // What kube-runtime does with every trigger (it panics without a name).
            let _ = ObjectRef::from_obj(&trigger);
        }
        let pbx = trigger(&watcher::Event::Apply(service("pbx", "SCTP")));
        assert_eq!(
            (
                pbx.metadata.namespace.as_deref(),
                pbx.metadata.name.as_deref()
            ),
            (Some("shop"), Some("pbx"))
        );
        assert_eq!(pbx.spec, None, "nothing else is carried");
    }

    #[test]
    fn a_relist_replaces_what_was_held_and_reports_only_a_difference() {
        let services = UnsupportedServices::default();
        for event in [
            watcher::Event::Init,
            watcher::Event::InitApply(service("pbx", "SCTP")),
            watcher::Event::InitDone,
        ] {
            services.apply(&event);
        }
        for event in [
            watcher::Event::Init,
            watcher::Event::InitApply(service("pbx", "SCTP")),
        ] {
            assert!(!services.apply(&event));
        }
        assert!(!services.apply(&watcher::Event::InitDone), "same findings");
        services.apply(&watcher::Event::Init);
        assert_eq!(names(&services), ["pbx"], "kept until the relist is done");
        assert!(
            services.apply(&watcher::Event::InitDone),
            "deleted while not watched"
        );
        assert!(services.list().is_empty());
    }
}
