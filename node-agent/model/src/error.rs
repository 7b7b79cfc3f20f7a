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
