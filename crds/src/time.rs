//! Timestamps on the wire the way Kubernetes writes `metav1.Time`: RFC 3339 in UTC with
//! whole seconds (`2026-11-22T01:18:18Z`).
//!
//! Writing whole seconds keeps Server-Side Apply from seeing a change on every write of an
//! otherwise identical status (sub-second noise would make every reconcile a write), and
//! matches what `kubectl` and the API server print. Reading accepts any RFC 3339 time.

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Deserializer, Serializer};

/// Drops the sub-second part, so that a time survives a round trip through the API unchanged.
pub fn truncate_to_seconds(time: DateTime<Utc>) -> DateTime<Utc> {
    DateTime::from_timestamp(time.timestamp(), 0).unwrap_or(time)
}

/// Formats a time as the API stores it.
pub fn format_rfc3339_seconds(time: &DateTime<Utc>) -> String {
    time.to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// `#[serde(with = "crate::time::rfc3339_seconds")]` for a required `DateTime<Utc>`.
pub mod rfc3339_seconds {
    use super::*;

    pub fn serialize<S: Serializer>(
        time: &DateTime<Utc>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&format_rfc3339_seconds(time))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<DateTime<Utc>, D::Error> {
        DateTime::<Utc>::deserialize(deserializer)
    }
}

/// `#[serde(with = "crate::time::option_rfc3339_seconds")]` for an optional `DateTime<Utc>`.
pub mod option_rfc3339_seconds {
    use super::*;

    pub fn serialize<S: Serializer>(
        time: &Option<DateTime<Utc>>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match time {
            Some(time) => serializer.serialize_str(&format_rfc3339_seconds(time)),
            None => serializer.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<DateTime<Utc>>, D::Error> {
        Option::<DateTime<Utc>>::deserialize(deserializer)
    }
}
