//! Reading Kubernetes manifests from a file or a directory: multi-document YAML
//! (JSON is YAML too), `kind: List` included. Services, EndpointSlices (v1 and
//! v1beta1), this node's DataplaneNode and the zone label of this node's Node
//! (for topology hints) are kept; other kinds are skipped, so a file can also
//! hold the Deployments that go with its Services. Services and EndpointSlices
//! that kube-proxy's label selector would hide are left out by the model
//! (`model::labels`), as the API server's selector leaves them out in cluster
//! mode.
//!
//! Any problem is reported with the file, the document's position in it (from 1)
//! and the field, and the whole set is rejected: the caller keeps serving the
//! last good set.

use std::collections::btree_map::Entry;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde::de::DeserializeOwned;
use switchyard_crds::{DataplaneNode, DataplaneNodeSpec};

use crate::model::{self, v1beta1, EndpointSliceModel, FieldError, ServiceModel};
use crate::Error;

/// Everything the manifests say that the agent uses.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Manifests {
    pub services: Vec<ServiceModel>,
    pub endpoint_slices: Vec<EndpointSliceModel>,
    /// The spec of the DataplaneNode named after this node, if the manifests have one.
    pub dataplane_node: Option<DataplaneNodeSpec>,
    /// The `topology.kubernetes.io/zone` label of the Node named after this
    /// node, if the manifests have one (its addresses are not read: standalone
    /// NodePorts are served on the host's addresses or `--node-ip`).
    pub node_zone: Option<String>,
}

/// Files a manifest path stands for: the file itself, or the `.yaml`, `.yml` and
/// `.json` files of a directory (not recursive), sorted by name.
pub fn manifest_files(path: &Path) -> Result<Vec<PathBuf>, Error> {
    let read_error = |source| Error::ReadManifest {
        path: path.to_path_buf(),
        source,
    };
    let metadata = std::fs::metadata(path).map_err(read_error)?;
    if !metadata.is_dir() {
        return Ok(vec![path.to_path_buf()]);
    }
    let mut files = Vec::new();
    for entry in std::fs::read_dir(path).map_err(read_error)? {
        let entry = entry.map_err(read_error)?;
        let file = entry.path();
        let is_manifest = file
            .extension()
            .and_then(|extension| extension.to_str())
            .is_some_and(|extension| matches!(extension, "yaml" | "yml" | "json"));
        if is_manifest && file.is_file() {
            files.push(file);
        }
    }
    files.sort();
    Ok(files)
}

/// What identifies a version of the manifests without reading them: names, sizes
/// and modification times. Polled to notice changes.
pub type Fingerprint = Vec<(PathBuf, u64, Option<SystemTime>)>;

pub fn fingerprint(path: &Path) -> Result<Fingerprint, Error> {
    manifest_files(path)?
        .into_iter()
        .map(|file| {
            let metadata = std::fs::metadata(&file).map_err(|source| Error::ReadManifest {
                path: file.clone(),
                source,
            })?;
            Ok((file, metadata.len(), metadata.modified().ok()))
        })
        .collect()
}

/// Reads and interprets every manifest file under `path`.
pub fn load(path: &Path, node_name: &str) -> Result<Manifests, Error> {
    let mut documents = Vec::new();
    for file in manifest_files(path)? {
        let text = std::fs::read_to_string(&file).map_err(|source| Error::ReadManifest {
            path: file.clone(),
            source,
        })?;
        documents.push((file, text));
    }
    parse(&documents, node_name)
}

fn invalid(file: &Path, document: usize, error: FieldError) -> Error {
    Error::InvalidManifest {
        path: file.to_path_buf(),
        document,
        field: error.field,
        reason: error.reason,
    }
}

/// Deserializes `value` as `T`, naming the failing field.
fn typed<T: DeserializeOwned>(value: serde_yaml::Value) -> Result<T, FieldError> {
    // The plain deserializer is faster; the path is only worth tracking once we
    // know there is an error to report.
    if let Ok(typed) = T::deserialize(&value) {
        return Ok(typed);
    }
    serde_path_to_error::deserialize(value).map_err(|error| {
        let path = error.path().to_string();
        FieldError {
            field: if path == "." {
                "(document)".to_string()
            } else {
                path
            },
            reason: error.into_inner().to_string(),
        }
    })
}

fn string_field<'a>(value: &'a serde_yaml::Value, name: &str) -> Result<&'a str, FieldError> {
    match value.get(name) {
        Some(serde_yaml::Value::String(text)) => Ok(text),
        Some(_) => Err(FieldError {
            field: name.to_string(),
            reason: "is not a string".to_string(),
        }),
        None => Err(FieldError {
            field: name.to_string(),
            reason: "is missing".to_string(),
        }),
    }
}

/// One object the agent uses, as read from one document.
#[derive(Clone, Debug, PartialEq)]
pub enum ManifestObject {
    Service(ServiceModel),
    EndpointSlice(EndpointSliceModel),
    DataplaneNode {
        name: String,
        spec: DataplaneNodeSpec,
    },
    /// A Node: its name and zone label.
    Node {
        name: String,
        zone: Option<String>,
    },
}

/// An object and where it is in its file.
#[derive(Clone, Debug, PartialEq)]
pub struct Located {
    /// Position of the document in the file, from 1.
    pub document: usize,
    /// `items[3].` for an item of a `kind: List`, empty otherwise.
    pub field_prefix: String,
    pub object: ManifestObject,
}

/// Interprets one file's documents; pure.
pub fn parse_file(file: &Path, text: &str) -> Result<Vec<Located>, Error> {
    let mut objects = Vec::new();
    for (index, document) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let number = index + 1;
        let value =
            <serde_yaml::Value as serde::Deserialize>::deserialize(document).map_err(|error| {
                invalid(
                    file,
                    number,
                    FieldError {
                        field: "(document)".to_string(),
                        reason: format!("is not valid YAML: {error}"),
                    },
                )
            })?;
        collect_object(&mut objects, value, file, number, "")?;
    }
    Ok(objects)
}

/// Interprets already-read files (`(path, contents)`); pure.
pub fn parse(files: &[(PathBuf, String)], node_name: &str) -> Result<Manifests, Error> {
    let parsed = files
        .iter()
        .map(|(file, text)| Ok((file.clone(), parse_file(file, text)?)))
        .collect::<Result<Vec<_>, Error>>()?;
    combine(
        parsed
            .iter()
            .map(|(file, objects)| (file.as_path(), objects.as_slice())),
        node_name,
    )
}

/// Where an object was read, to name both places when it is defined twice.
type Origin<'a> = (&'a Path, usize);

/// The objects of several files as one set: a Service, EndpointSlice or this
/// node's DataplaneNode defined twice is an error naming both places.
pub fn combine<'a>(
    files: impl IntoIterator<Item = (&'a Path, &'a [Located])>,
    node_name: &str,
) -> Result<Manifests, Error> {
    let mut manifests = Manifests::default();
    // Where each object ("Service ns/name", "Node name", ...) was first defined.
    let mut defined: BTreeMap<String, Origin<'a>> = BTreeMap::new();
    for (file, objects) in files {
        for located in objects {
            let origin = (file, located.document);
            let mut define = |what: String| match defined.entry(what) {
                Entry::Vacant(slot) => {
                    slot.insert(origin);
                    Ok(())
                }
                Entry::Occupied(first) => {
                    let (first_file, first_document) = first.get();
                    Err(Error::InvalidManifest {
                        path: file.to_path_buf(),
                        document: located.document,
                        field: format!("{}metadata.name", located.field_prefix),
                        reason: format!(
                            "{} is also defined in {}, document {first_document}",
                            first.key(),
                            first_file.display(),
                        ),
                    })
                }
            };
            match &located.object {
                ManifestObject::Service(model) => {
                    define(format!("Service {}", model.name))?;
                    manifests.services.push(model.clone());
                }
                ManifestObject::EndpointSlice(model) => {
                    define(format!("EndpointSlice {}", model.slice_name))?;
                    manifests.endpoint_slices.push(model.clone());
                }
                ManifestObject::DataplaneNode { name, spec } if name == node_name => {
                    define(format!("DataplaneNode {node_name}"))?;
                    manifests.dataplane_node = Some(spec.clone());
                }
                ManifestObject::Node { name, zone } if name == node_name => {
                    define(format!("Node {node_name}"))?;
                    manifests.node_zone = zone.clone();
                }
                // Other nodes' objects.
                ManifestObject::DataplaneNode { .. } | ManifestObject::Node { .. } => {}
            }
        }
    }
    Ok(manifests)
}

/// Parsed files by path, reused while a file's size and modification time stay
/// the same: a change to one file of a directory re-reads only that file.
#[derive(Clone, Debug, Default)]
pub struct ManifestCache {
    files: BTreeMap<PathBuf, (u64, Option<SystemTime>, Vec<Located>)>,
}

impl ManifestCache {
    /// Reads the manifests under `path`, parsing only files that changed.
    pub fn load(&mut self, path: &Path, node_name: &str) -> Result<Manifests, Error> {
        let files = manifest_files(path)?;
        self.files.retain(|cached, _| files.contains(cached));
        for file in &files {
            let read_error = |source| Error::ReadManifest {
                path: file.clone(),
                source,
            };
            let metadata = std::fs::metadata(file).map_err(read_error)?;
            let stamp = (metadata.len(), metadata.modified().ok());
            if let Some((length, modified, _)) = self.files.get(file) {
                if (*length, *modified) == stamp {
                    continue;
                }
            }
            let text = std::fs::read_to_string(file).map_err(read_error)?;
            let objects = parse_file(file, &text)?;
            self.files.insert(file.clone(), (stamp.0, stamp.1, objects));
        }
        combine(
            self.files
                .iter()
                .map(|(file, (_, _, objects))| (file.as_path(), objects.as_slice())),
            node_name,
        )
    }
}

fn collect_object(
    objects: &mut Vec<Located>,
    value: serde_yaml::Value,
    file: &Path,
    document: usize,
    field_prefix: &str,
) -> Result<(), Error> {
    if value.is_null() {
        return Ok(());
    }
    let fail = |error: FieldError| {
        invalid(
            file,
            document,
            FieldError {
                field: format!("{field_prefix}{}", error.field),
                reason: error.reason,
            },
        )
    };
    let api_version = string_field(&value, "apiVersion")
        .map_err(fail)?
        .to_string();
    let kind = string_field(&value, "kind").map_err(fail)?.to_string();
    let mut push = |object: ManifestObject| {
        objects.push(Located {
            document,
            field_prefix: field_prefix.to_string(),
            object,
        })
    };
    match (api_version.as_str(), kind.as_str()) {
        ("v1", "List") => {
            let items = match value.get("items") {
                Some(serde_yaml::Value::Sequence(items)) => items.clone(),
                None | Some(serde_yaml::Value::Null) => Vec::new(),
                Some(_) => {
                    return Err(fail(FieldError {
                        field: "items".to_string(),
                        reason: "is not a list".to_string(),
                    }))
                }
            };
            for (index, item) in items.into_iter().enumerate() {
                collect_object(
                    objects,
                    item,
                    file,
                    document,
                    &format!("{field_prefix}items[{index}]."),
                )?;
            }
        }
        ("v1", "Service") => {
            let service: Service = typed(value).map_err(fail)?;
            if let Some(model) = model::service_from_v1(&service).map_err(fail)? {
                push(ManifestObject::Service(model));
            }
        }
        ("discovery.k8s.io/v1", "EndpointSlice") => {
            let slice: EndpointSlice = typed(value).map_err(fail)?;
            if let Some(model) = model::endpoint_slice_from_v1(&slice).map_err(fail)? {
                push(ManifestObject::EndpointSlice(model));
            }
        }
        (v1beta1::API_VERSION, "EndpointSlice") => {
            let slice: v1beta1::EndpointSlice = typed(value).map_err(fail)?;
            if let Some(model) = v1beta1::endpoint_slice_from_v1beta1(&slice).map_err(fail)? {
                push(ManifestObject::EndpointSlice(model));
            }
        }
        ("v1", "Node") => {
            let node: Node = typed(value).map_err(fail)?;
            push(ManifestObject::Node {
                zone: crate::core::node::zone_of(&node.metadata),
                name: node.metadata.name.unwrap_or_default(),
            });
        }
        ("switchyard.dev/v1alpha1", "DataplaneNode") => {
            let node: DataplaneNode = typed(value).map_err(fail)?;
            push(ManifestObject::DataplaneNode {
                name: node.metadata.name.unwrap_or_default(),
                spec: node.spec,
            });
        }
        _ => {
            tracing::debug!(
                file = %file.display(),
                document,
                api_version,
                kind,
                "skipping a manifest the agent does not use"
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
