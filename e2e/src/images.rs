//! The image-to-binary table of the pod runner.
//!
//! Hollow kubelets run no containers. For pods whose container image is in this
//! table, the pod runner runs the named local binary instead. The format is one
//! entry a line, `IMAGE BINARY`, `#` starts a comment; an image ending in `*`
//! matches every image that starts with the text before it. When several lines
//! match, the last one wins, so a file appended after the built-in entries
//! overrides them (an upgrade test can point one image at another build).

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

#[derive(Debug, Clone, PartialEq, Eq)]
struct ImageEntry {
    pattern: ImagePattern,
    binary: PathBuf,
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
            let [image, binary] = fields.as_slice() else {
                return Err(E2eError::ParseImageTable {
                    path: origin.to_path_buf(),
                    line: index + 1,
                    message: format!("expected `IMAGE BINARY`, found {line:?}"),
                });
            };
            if !binary.starts_with('/') {
                return Err(E2eError::ParseImageTable {
                    path: origin.to_path_buf(),
                    line: index + 1,
                    message: format!("the binary {binary:?} is not an absolute path"),
                });
            }
            let pattern = match image.strip_suffix('*') {
                Some(prefix) => ImagePattern::Prefix(prefix.to_string()),
                None => ImagePattern::Exact(image.to_string()),
            };
            entries.push(ImageEntry {
                pattern,
                binary: PathBuf::from(binary),
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

    /// The binary to run for a container image, if the image is managed.
    pub fn binary_for(&self, image: &str) -> Option<&Path> {
        self.entries
            .iter()
            .rev()
            .find(|entry| entry.pattern.matches(image))
            .map(|entry| entry.binary.as_path())
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(text: &str) -> ImageTable {
        ImageTable::parse(text, Path::new("images.conf")).unwrap()
    }

    #[test]
    fn an_exact_image_maps_to_its_binary_and_others_are_unmanaged() {
        let table = table("# comment\n\nregistry.k8s.io/kube-proxy:v1.20.2 /cache/kube-proxy\n");
        assert_eq!(
            table.binary_for("registry.k8s.io/kube-proxy:v1.20.2"),
            Some(Path::new("/cache/kube-proxy"))
        );
        assert_eq!(table.binary_for("registry.k8s.io/kube-proxy:v1.21.0"), None);
        assert_eq!(table.binary_for("nginx"), None);
    }

    #[test]
    fn a_trailing_star_matches_every_tag() {
        let table = table("switchyard/agent:* /build/switchyard-agent  # any tag\n");
        assert_eq!(
            table.binary_for("switchyard/agent:0.2.0"),
            Some(Path::new("/build/switchyard-agent"))
        );
        assert_eq!(table.binary_for("switchyard/operator:0.2.0"), None);
    }

    #[test]
    fn a_later_line_overrides_an_earlier_one() {
        let table = table("switchyard/agent:* /old/agent\nswitchyard/agent:v2 /new/agent\n");
        assert_eq!(
            table.binary_for("switchyard/agent:v2"),
            Some(Path::new("/new/agent"))
        );
        assert_eq!(
            table.binary_for("switchyard/agent:v1"),
            Some(Path::new("/old/agent"))
        );
    }

    #[test]
    fn malformed_lines_are_rejected_with_their_line_number() {
        let error = ImageTable::parse("a /b\nonly-one-field\n", Path::new("t.conf")).unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("failed to parse the image table t.conf, line 2"),
            "{error}"
        );
        let error = ImageTable::parse("image relative/path\n", Path::new("t.conf")).unwrap_err();
        assert!(
            error.to_string().contains("not an absolute path"),
            "{error}"
        );
    }
}
