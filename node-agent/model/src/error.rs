//! The core's one error: a failure of the Service maps behind [`crate::maps::ServiceMaps`].
//! The map's own error (aya's, or an injected fault) is kept as the source.

/// The cause a map implementation gives for a failed read or update.
pub type MapFault = Box<dyn std::error::Error + Send + Sync>;

/// A failed read or update of one of the Service maps.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("failed to update map {map}")]
    UpdateMap {
        map: &'static str,
        #[source]
        source: MapFault,
    },
    #[error("failed to read map {map}")]
    ReadMap {
        map: &'static str,
        #[source]
        source: MapFault,
    },
    /// An apply went through every entry but could not write some: every
    /// other write was made. The first failed write is the cause.
    #[error("failed to bring {} map entries of {} to their desired state", .failed.0.len(), services_of(&.failed.0))]
    ApplyIncomplete {
        applied: crate::sync::ApplyReport,
        #[source]
        failed: FailedEntries,
    },
}

/// The entries an apply left behind; as an error, the first failed write.
#[derive(Debug)]
pub struct FailedEntries(pub Vec<crate::sync::FailedEntry>);

impl FailedEntries {
    fn first_failure(&self) -> Option<(&crate::sync::FailedEntry, &Error)> {
        self.0.iter().find_map(|entry| match &entry.fault {
            crate::sync::EntryFault::Failed(error) => Some((entry, error)),
            crate::sync::EntryFault::HeldBack => None,
        })
    }
}

impl std::fmt::Display for FailedEntries {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.first_failure() {
            Some((entry, _)) => write!(formatter, "the first failed entry is {:?}", entry.entry),
            None => formatter.write_str("every entry left was held back"),
        }
    }
}

impl std::error::Error for FailedEntries {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.first_failure()
            .map(|(_, error)| error as &(dyn std::error::Error + 'static))
    }
}

impl Error {
    /// The error of an apply that left `failed` behind.
    pub(crate) fn incomplete(
        applied: crate::sync::ApplyReport,
        failed: Vec<crate::sync::FailedEntry>,
    ) -> Self {
        Error::ApplyIncomplete {
            applied,
            failed: FailedEntries(failed),
        }
    }

    /// The Services an incomplete apply failed, with how many entries of each
    /// ("" for entries of no desired Service); `None` for any other error.
    pub fn failed_services(&self) -> Option<std::collections::BTreeMap<String, usize>> {
        let Error::ApplyIncomplete { failed, .. } = self else {
            return None;
        };
        let mut by_service = std::collections::BTreeMap::new();
        for entry in &failed.0 {
            if entry.services.is_empty() {
                *by_service.entry(String::new()).or_default() += 1;
            }
            for service in &entry.services {
                *by_service.entry(service.to_string()).or_default() += 1;
            }
        }
        Some(by_service)
    }
}

/// "Services a/b, c/d" (the first few), or "no desired Service".
fn services_of(failed: &[crate::sync::FailedEntry]) -> String {
    let mut names: Vec<String> = failed
        .iter()
        .flat_map(|entry| entry.services.iter().map(|service| service.to_string()))
        .collect();
    names.sort();
    names.dedup();
    match names.len() {
        0 => "no desired Service".to_string(),
        1..=5 => format!("Services {}", names.join(", ")),
        count => format!("Services {} and {} more", names[..5].join(", "), count - 5),
    }
}

/// An error with every cause below it, joined by ": " (what logs and statuses
/// show: `Display` of an error says only its own step).
pub struct Chain<'a>(pub &'a (dyn std::error::Error + 'static));

impl std::fmt::Display for Chain<'_> {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(formatter, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(cause) = source {
            write!(formatter, ": {cause}")?;
            source = cause.source();
        }
        Ok(())
    }
}

/// `error` with its causes, as one line.
pub fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    Chain(error).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chain_names_every_step_down_to_the_first_cause() {
        let error = Error::UpdateMap {
            map: "frontends",
            source: "map is full".into(),
        };
        assert_eq!(chain(&error), "failed to update map frontends: map is full");
    }
}
