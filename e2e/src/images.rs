//! The image table of the pod runner.
//!
//! Hollow kubelets run no containers. For pods whose container image is in this
//! table, the pod runner runs what the table names: a local binary (`IMAGE /path`, run
//! as a plain process: kube-proxy, test probes), or an OCI image archive
//! (`IMAGE oci-archive:/path.oci.tar`, run from its image with an OCI runtime and the
//! container's securityContext and volumes, as a kubelet would: Switchyard's own pods).
//! One entry a line, `#` starts a comment; an image ending in `*` matches every image
//! that starts with the text before it. When several lines match, the last one wins, so
//! a file appended after the built-in entries overrides them (an upgrade test can point
//! one image at another build).

use std::path::{Path, PathBuf};

use crate::error::{E2eError, Result};

#[derive(Debug, Clone, PartialEq, Eq)]
enum ImagePattern {
    Exact(String),
    Prefix(String),
}

impl ImagePattern {
    fn matches(&self, image: &str) -> bool {
        match self {
            ImagePattern::Exact(exact) => image == exact,
            ImagePattern::Prefix(prefix) => image.starts_with(prefix.as_str()),
        }
    }
}

/// What the runner runs for a managed image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageSource {
    /// A local binary, run as a plain process.
    Binary(PathBuf),
    /// An OCI image layout archive (`make images`), run with an OCI runtime.
    OciArchive(PathBuf),
}

/// The prefix of an OCI image archive in the table.
pub const OCI_ARCHIVE_PREFIX: &str = "oci-archive:";

#[derive(Debug, Clone, PartialEq, Eq)]
struct ImageEntry {
    pattern: ImagePattern,
    source: ImageSource,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImageTable {
    entries: Vec<ImageEntry>,
}

impl ImageTable {
    pub fn parse(text: &str, origin: &Path) -> Result<Self> {
        let mut entries = Vec::new();
        for (index, raw_line) in text.lines().enumerate() {
            let line = raw_line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let fields: Vec<&str> = line.split_whitespace().collect();
            let [image, target] = fields.as_slice() else {
                return Err(E2eError::ParseImageTable {
                    path: origin.to_path_buf(),
                    line: index + 1,
                    message: format!(
                        "expected `IMAGE BINARY` or `IMAGE {OCI_ARCHIVE_PREFIX}ARCHIVE`, found {line:?}"
                    ),
                });
            };
            let (path, source): (&str, fn(PathBuf) -> ImageSource) =
                match target.strip_prefix(OCI_ARCHIVE_PREFIX) {
                    Some(archive) => (archive, ImageSource::OciArchive),
                    None => (target, ImageSource::Binary),
                };
            if !path.starts_with('/') {
                return Err(E2eError::ParseImageTable {
                    path: origin.to_path_buf(),
                    line: index + 1,
                    message: format!("the binary or archive {path:?} is not an absolute path"),
                });
            }
            let pattern = match image.strip_suffix('*') {
                Some(prefix) => ImagePattern::Prefix(prefix.to_string()),
                None => ImagePattern::Exact(image.to_string()),
            };
            entries.push(ImageEntry {
                pattern,
                source: source(PathBuf::from(path)),
            });
        }
        Ok(Self { entries })
    }

    pub fn read(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|source| E2eError::ReadFile {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text, path)
    }

    /// What to run for a container image, if the image is managed.
    pub fn source_for(&self, image: &str) -> Option<&ImageSource> {
        self.entries
            .iter()
            .rev()
            .find(|entry| entry.pattern.matches(image))
            .map(|entry| &entry.source)
    }

    /// The binary to run for a container image, if the image is managed as a binary.
    pub fn binary_for(&self, image: &str) -> Option<&Path> {
        match self.source_for(image)? {
            ImageSource::Binary(path) => Some(path.as_path()),
            ImageSource::OciArchive(_) => None,
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests;
