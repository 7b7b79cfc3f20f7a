//! Events for every step the operator takes and every step it refuses.
//!
//! How an Event is shaped, named, aggregated and written (core/v1 without `eventTime`, so a
//! Kubernetes 1.20 API server accepts Events about cluster-scoped objects) is shared with the
//! agent: see [`switchyard_telemetry::events`]. This module names the operator as the reporter
//! and turns a failed write into the operator's error.

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::{Event, ObjectReference};
use kube::Client;
use switchyard_telemetry::events::{self as shared, Publisher, Reporter};

use crate::error::Error;

mod steps;

pub use shared::{event_name, reference_to, EventType, Occurrence};
pub use steps::{
    bulk_creation, creation, refusal, steps_of, unsupported_service, Steps,
    UNSUPPORTED_BY_DATAPLANE,
};

/// The component named in every Event (`source.component`, `reportingComponent`).
pub const REPORTING_COMPONENT: &str = "switchyard-operator";

/// The Event to create for `occurrence` about `involved`, reported by this operator instance.
pub fn build_event(
    involved: &ObjectReference,
    occurrence: &Occurrence,
    reporting_instance: &str,
    now: DateTime<Utc>,
) -> Event {
    shared::build_event(
        involved,
        occurrence,
        &Reporter::new(REPORTING_COMPONENT, reporting_instance),
        now,
    )
}

/// Writes Events through the API.
#[derive(Clone)]
pub struct Recorder {
    publisher: Publisher,
}

impl Recorder {
    pub fn new(client: Client, reporting_instance: impl Into<String>) -> Self {
        Self {
            publisher: Publisher::new(
                client,
                Reporter::new(REPORTING_COMPONENT, reporting_instance),
            ),
        }
    }

    /// Records `occurrence` about `involved`: creates the Event, or bumps the count of the same
    /// Event recorded earlier.
    pub async fn publish(
        &self,
        involved: &ObjectReference,
        occurrence: &Occurrence,
    ) -> Result<(), Error> {
        self.publisher
            .publish(involved, occurrence)
            .await
            .map_err(|error| Error::PublishEvent {
                name: error.name,
                source: error.source.into(),
            })
    }

    /// Like [`Self::publish`], but a failure is only logged: an Event that cannot be written must
    /// never stop a transition step.
    pub async fn publish_or_log(&self, involved: &ObjectReference, occurrence: &Occurrence) {
        if let Err(error) = self.publish(involved, occurrence).await {
            tracing::warn!(error = %crate::error::describe(&error), reason = %occurrence.reason, "failed to record an Event");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_crds::{DataplaneConfig, DataplaneConfigSpec};

    /// The shape and naming rules are the shared module's (tested there); here, that the
    /// operator names itself and that a CRD's reference carries its API version.
    #[test]
    fn the_operators_events_name_the_operator_and_the_crds_api_version() {
        let mut config = DataplaneConfig::new("default", DataplaneConfigSpec::default());
        config.metadata.uid = Some("0b7c".into());
        let occurrence = Occurrence::normal("KubeProxyDisabled", "Disable", "kube-proxy disabled");
        let event = build_event(
            &reference_to(&config),
            &occurrence,
            "operator-0",
            Utc::now(),
        );
        assert_eq!(
            event.involved_object.api_version.as_deref(),
            Some("switchyard.dev/v1alpha1")
        );
        assert_eq!(
            event.source.and_then(|source| source.component).as_deref(),
            Some(REPORTING_COMPONENT)
        );
        assert_eq!(
            event.reporting_component.as_deref(),
            Some(REPORTING_COMPONENT)
        );
        assert_eq!(event.reporting_instance.as_deref(), Some("operator-0"));
    }

    #[test]
    fn event_names_are_unchanged_by_the_move_to_the_shared_module() {
        // The same name as before the move: an upgrade must not duplicate recent Events.
        let mut config = DataplaneConfig::new("default", DataplaneConfigSpec::default());
        config.metadata.uid = Some("0b7c".into());
        let occurrence = Occurrence::warning("KubeProxyManagedExternally", "Disable", "refused");
        assert_eq!(
            event_name(&reference_to(&config), &occurrence),
            "default.cc569294cf76d4e2"
        );
    }
}
