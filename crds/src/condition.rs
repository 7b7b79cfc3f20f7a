//! Conditions in the standard `metav1.Condition` shape.
//!
//! Switchyard has its own struct rather than `k8s_openapi`'s `Condition` for two reasons:
//! the workspace's time type is chrono's (k8s-openapi 0.29 uses jiff), and the schema can
//! then enforce what `metav1.Condition` only documents (status is `True`, `False` or
//! `Unknown`; reason is a CamelCase identifier). On the wire both are identical, so
//! `kubectl wait --for=condition=Ready` and Argo CD's health checks read them as usual.

use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Whether a condition holds. Exactly the three values of `metav1.ConditionStatus`.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, JsonSchema, PartialEq, Eq, Hash)]
pub enum ConditionStatus {
    True,
    False,
    Unknown,
}

impl ConditionStatus {
    /// `True` for `true`, `False` for `false`.
    pub fn from_bool(holds: bool) -> Self {
        if holds {
            Self::True
        } else {
            Self::False
        }
    }
}

/// One aspect of the current state of the object, in the standard `metav1.Condition` shape.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// Type of the condition, in CamelCase (for example `Ready`).
    #[serde(rename = "type")]
    #[schemars(length(min = 1, max = 316))]
    pub type_: String,
    /// Whether the condition holds: `True`, `False` or `Unknown`.
    pub status: ConditionStatus,
    /// A CamelCase identifier of why the condition last changed (for example `KubeProxyConflict`).
    #[schemars(
        length(min = 1, max = 1024),
        regex(pattern = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
    )]
    pub reason: String,
    /// A human-readable explanation of the condition; may be empty.
    #[serde(default, deserialize_with = "null_as_empty")]
    #[schemars(length(max = 32768), transform = message_schema)]
    pub message: String,
    /// When the condition last changed from one status to another (RFC 3339).
    #[serde(with = "crate::time::rfc3339_seconds")]
    #[schemars(with = "DateTime<Utc>")]
    pub last_transition_time: DateTime<Utc>,
    /// The `metadata.generation` of the object that the condition was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub observed_generation: Option<i64>,
}

/// The schema of `message`, shaped for Kubernetes 1.20, whose validator (measured with a 1.20.2
/// API server, see `crds/tests/apiserver-1.20.sh`) takes an empty string inside an array item
/// for `null` and rejects it as "must be of type string: null", and which also rejects the CRD
/// when the field has an empty-string default. So: nullable, and no default. Reading maps a
/// `null` or missing message to the empty string.
fn message_schema(schema: &mut schemars::Schema) {
    schema.remove("default");
    schema.insert("nullable".into(), true.into());
}

fn null_as_empty<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
    Ok(Option::<String>::deserialize(deserializer)?.unwrap_or_default())
}

impl Condition {
    /// A condition that changed at `now` (use [`set_condition`] to keep the time of the last
    /// real change).
    pub fn new(
        type_: &str,
        status: ConditionStatus,
        reason: &str,
        message: impl Into<String>,
        observed_generation: Option<i64>,
        now: DateTime<Utc>,
    ) -> Self {
        Self {
            type_: type_.to_owned(),
            status,
            reason: reason.to_owned(),
            message: message.into(),
            last_transition_time: crate::time::truncate_to_seconds(now),
            observed_generation,
        }
    }

    /// Whether the condition's status is `True`.
    pub fn is_true(&self) -> bool {
        self.status == ConditionStatus::True
    }
}

/// The condition of type `type_`, if present.
pub fn find_condition<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|condition| condition.type_ == type_)
}

/// Whether the condition of type `type_` is present with status `True`.
pub fn condition_is_true(conditions: &[Condition], type_: &str) -> bool {
    find_condition(conditions, type_).is_some_and(Condition::is_true)
}

/// Whether the condition of type `type_` is present with status `False`.
pub fn condition_is_false(conditions: &[Condition], type_: &str) -> bool {
    find_condition(conditions, type_)
        .is_some_and(|condition| condition.status == ConditionStatus::False)
}

/// Inserts or replaces the condition of `condition.type_`, keeping the previous
/// `lastTransitionTime` when the status did not change (as `meta.SetStatusCondition` does),
/// so that the time says when the condition really changed, not when it was last written.
pub fn set_condition(conditions: &mut Vec<Condition>, mut condition: Condition) {
    match conditions
        .iter_mut()
        .find(|existing| existing.type_ == condition.type_)
    {
        Some(existing) => {
            if existing.status == condition.status {
                condition.last_transition_time = existing.last_transition_time;
            }
            *existing = condition;
        }
        None => conditions.push(condition),
    }
}
