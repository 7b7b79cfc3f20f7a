//! What process to run for a pod: the pure translation of a Pod object (and
//! the image table) into binaries, arguments and environment.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, EnvVar, Pod};

use super::container::{volume_mounts, ContainerRun, Security};
use crate::images::{ImageSource, ImageTable};

/// The path at which processes find their service-account credentials, as in a
/// real container.
pub const SERVICE_ACCOUNT_MOUNT_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// Identifies one process: a container of a pod instance.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ProcessKey {
    pub pod_uid: String,
    pub container: String,
}

/// The pod annotation naming a network namespace (made by a test on the pod's node, under
/// `/run/netns`) for the pod's processes: the e2e cluster's stand-in for a CNI plugin. Pods
/// without it run in their node's network namespace.
pub const NETWORK_NAMESPACE_ANNOTATION: &str = "e2e.switchyard.dev/network-namespace";

/// Facts the runner knows about the cluster, not from the pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunnerContext {
    /// The variables of the `kubernetes` Service every container gets, as a kubelet gives
    /// them (see [`service_environment`]); `None` until the runner has read the Service.
    pub kubernetes_service_environment: Option<Vec<(String, String)>>,
    /// InternalIP of each node by name.
    pub node_addresses: BTreeMap<String, String>,
}

/// A value a container's environment takes from another object.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum ObjectKeyReference {
    ConfigMap { name: String, key: String },
    Secret { name: String, key: String },
}

/// What runs for a container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Program {
    /// A local binary as a plain process (kube-proxy, test probes): `command`'s first word
    /// is replaced by the binary, the rest and `args` are its arguments.
    Binary {
        binary: PathBuf,
        arguments: Vec<String>,
    },
    /// The container's image (an OCI archive) run with an OCI runtime.
    Image {
        archive: PathBuf,
        container: Box<ContainerRun>,
    },
}

impl Program {
    /// What the runner's events and logs name: the binary, or the image's archive.
    pub fn describe(&self) -> String {
        match self {
            Program::Binary { binary, .. } => binary.display().to_string(),
            Program::Image { archive, .. } => format!("image {}", archive.display()),
        }
    }
}

/// Everything needed to start the process of one container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessSpec {
    pub key: ProcessKey,
    pub namespace: String,
    pub pod_name: String,
    pub node: String,
    /// Processes with the same owner key replace each other: a new one starts
    /// only after the old one has exited.
    pub owner_key: String,
    pub image: String,
    pub program: Program,
    pub environment: Vec<(String, String)>,
    /// An init container: it runs to completion, and is not run again once it succeeded.
    pub run_to_completion: bool,
    /// The init containers that must have succeeded before this one starts.
    pub after: Vec<ProcessKey>,
    /// The secret holding the service-account token mounted at
    /// [`SERVICE_ACCOUNT_MOUNT_PATH`], if the container mounts one.
    pub service_account_secret: Option<String>,
    /// The network namespace (a name under `/run/netns`) the process runs in instead of its
    /// node's, from [`NETWORK_NAMESPACE_ANNOTATION`].
    pub network_namespace: Option<String>,
    pub grace_period: Duration,
    /// The pod is being deleted (`deletionTimestamp` is set).
    pub deleting: bool,
}

/// Why a managed container cannot be started (yet).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SpecProblem {
    MissingField(&'static str),
    UnknownNodeAddress(String),
    MissingReference(ObjectKeyReference),
    UnsupportedFieldPath(String),
    /// The runner has not read the `kubernetes` Service yet (a kubelet would not give a
    /// container an environment without it either).
    KubernetesServiceUnknown,
    InvalidNetworkNamespace(String),
    /// Something of the pod the runner does not do (it would be wrong to start the
    /// container without it).
    Unsupported(String),
}

impl std::fmt::Display for SpecProblem {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SpecProblem::MissingField(field) => write!(formatter, "the pod has no {field}"),
            SpecProblem::UnknownNodeAddress(node) => {
                write!(formatter, "node {node} has no known address")
            }
            SpecProblem::MissingReference(reference) => {
                write!(formatter, "{reference:?} is not available")
            }
            SpecProblem::UnsupportedFieldPath(path) => {
                write!(formatter, "fieldRef {path} is not supported")
            }
            SpecProblem::KubernetesServiceUnknown => {
                write!(formatter, "the kubernetes Service has not been read yet")
            }
            SpecProblem::InvalidNetworkNamespace(message) => write!(
                formatter,
                "annotation {NETWORK_NAMESPACE_ANNOTATION}: {message}"
            ),
            SpecProblem::Unsupported(what) => {
                write!(formatter, "the e2e pod runner does not support {what}")
            }
        }
    }
}

const DEFAULT_GRACE_PERIOD: Duration = Duration::from_secs(30);

/// The key under which replacements of a pod wait for each other: DaemonSet
/// pods per node, Deployment (ReplicaSet) pods per Deployment, other pods per
/// name.
pub fn owner_key(pod: &Pod, container: &str) -> String {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let node = pod
        .spec
        .as_ref()
        .and_then(|spec| spec.node_name.as_deref())
        .unwrap_or("");
    let controller = pod
        .metadata
        .owner_references
        .as_ref()
        .and_then(|owners| owners.iter().find(|owner| owner.controller == Some(true)));
    match controller {
        Some(owner) if owner.kind == "DaemonSet" => {
            format!("daemonset/{namespace}/{}/{node}/{container}", owner.name)
        }
        Some(owner) if owner.kind == "ReplicaSet" => {
            let hash = pod
                .metadata
                .labels
                .as_ref()
                .and_then(|labels| labels.get("pod-template-hash"));
            let deployment = match hash {
                Some(hash) => owner
                    .name
                    .strip_suffix(&format!("-{hash}"))
                    .unwrap_or(&owner.name),
                None => &owner.name,
            };
            format!("deployment/{namespace}/{deployment}/{container}")
        }
        _ => format!(
            "pod/{namespace}/{}/{container}",
            pod.metadata.name.as_deref().unwrap_or("")
        ),
    }
}

/// The objects a pod's managed containers take environment values from.
pub fn references(pod: &Pod, images: &ImageTable) -> Vec<ObjectKeyReference> {
    let mut found = Vec::new();
    for (_, container) in managed_containers(pod, images) {
        for variable in container.env.iter().flatten() {
            if let Some(reference) = reference_of(variable) {
                found.push(reference);
            }
        }
    }
    found.sort();
    found.dedup();
    found
}

fn reference_of(variable: &EnvVar) -> Option<ObjectKeyReference> {
    let source = variable.value_from.as_ref()?;
    if let Some(selector) = &source.config_map_key_ref {
        return Some(ObjectKeyReference::ConfigMap {
            name: selector.name.clone(),
            key: selector.key.clone(),
        });
    }
    source
        .secret_key_ref
        .as_ref()
        .map(|selector| ObjectKeyReference::Secret {
            name: selector.name.clone(),
            key: selector.key.clone(),
        })
}

/// The pod's init containers (each `true`) then its containers whose image is managed.
fn managed_containers<'a>(
    pod: &'a Pod,
    images: &'a ImageTable,
) -> impl Iterator<Item = (bool, &'a Container)> + 'a {
    pod.spec
        .iter()
        .flat_map(|spec| {
            spec.init_containers
                .iter()
                .flatten()
                .map(|container| (true, container))
                .chain(spec.containers.iter().map(|container| (false, container)))
        })
        .filter(move |(_, container)| {
            container
                .image
                .as_deref()
                .is_some_and(|image| images.source_for(image).is_some())
        })
}

/// The processes to run for a pod: one per container (init containers first) whose image
/// is in the table. Pods not bound to a node, finished pods and unmanaged images give none.
pub fn process_specs(
    pod: &Pod,
    images: &ImageTable,
    context: &RunnerContext,
    values: &BTreeMap<ObjectKeyReference, String>,
) -> Vec<Result<ProcessSpec, (ProcessKey, SpecProblem)>> {
    let Some(spec) = pod.spec.as_ref() else {
        return Vec::new();
    };
    let Some(node) = spec.node_name.clone() else {
        return Vec::new();
    };
    let phase = pod
        .status
        .as_ref()
        .and_then(|status| status.phase.as_deref());
    if matches!(phase, Some("Succeeded") | Some("Failed")) {
        return Vec::new();
    }
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let mut init_containers: Vec<ProcessKey> = Vec::new();
    managed_containers(pod, images)
        .map(|(init, container)| {
            let key = ProcessKey {
                pod_uid: uid.clone(),
                container: container.name.clone(),
            };
            let after = init_containers.clone();
            if init {
                init_containers.push(key.clone());
            }
            container_spec(pod, container, &node, images, context, values)
                .map(|spec| ProcessSpec {
                    run_to_completion: init,
                    after,
                    ..spec
                })
                .map_err(|problem| (key, problem))
        })
        .collect()
}

fn container_spec(
    pod: &Pod,
    container: &Container,
    node: &str,
    images: &ImageTable,
    context: &RunnerContext,
    values: &BTreeMap<ObjectKeyReference, String>,
) -> Result<ProcessSpec, SpecProblem> {
    let uid = pod
        .metadata
        .uid
        .clone()
        .ok_or(SpecProblem::MissingField("metadata.uid"))?;
    let pod_name = pod
        .metadata
        .name
        .clone()
        .ok_or(SpecProblem::MissingField("metadata.name"))?;
    let namespace = pod
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".to_string());
    let image = container
        .image
        .clone()
        .ok_or(SpecProblem::MissingField("container image"))?;
    let source = images
        .source_for(&image)
        .ok_or(SpecProblem::MissingField("a binary for the image"))?
        .clone();
    let node_address = context
        .node_addresses
        .get(node)
        .cloned()
        .ok_or_else(|| SpecProblem::UnknownNodeAddress(node.to_string()))?;
    let pod_spec = pod.spec.as_ref().ok_or(SpecProblem::MissingField("spec"))?;
    let host_network = pod_spec.host_network == Some(true);
    let pod_ip = pod
        .status
        .as_ref()
        .and_then(|status| status.pod_ip.clone())
        .unwrap_or_else(|| node_address.clone());

    let network_namespace = network_namespace(pod, host_network)?;

    // The variables a kubelet gives every container (the `kubernetes` Service's, so
    // in-cluster clients go through that Service), then the container's own, which win.
    let mut environment = context
        .kubernetes_service_environment
        .clone()
        .ok_or(SpecProblem::KubernetesServiceUnknown)?;
    environment.push((
        "HOSTNAME".into(),
        if host_network {
            node.to_string()
        } else {
            pod_name.clone()
        },
    ));
    for variable in container.env.iter().flatten() {
        let value = match (&variable.value, &variable.value_from) {
            (_, Some(source)) => {
                if let Some(field) = &source.field_ref {
                    field_value(pod, &field.field_path, node, &node_address, &pod_ip)?
                } else if source.resource_field_ref.is_some() {
                    // Hollow nodes have no resource accounting: leave it unset.
                    continue;
                } else if let Some(reference) = reference_of(variable) {
                    let optional = source
                        .config_map_key_ref
                        .as_ref()
                        .and_then(|selector| selector.optional)
                        .or_else(|| {
                            source
                                .secret_key_ref
                                .as_ref()
                                .and_then(|selector| selector.optional)
                        })
                        .unwrap_or(false);
                    match values.get(&reference) {
                        Some(value) => value.clone(),
                        None if optional => continue,
                        None => return Err(SpecProblem::MissingReference(reference)),
                    }
                } else {
                    continue;
                }
            }
            (Some(value), None) => expand_references(value, &environment),
            (None, None) => String::new(),
        };
        environment.retain(|(name, _)| name != &variable.name);
        environment.push((variable.name.clone(), value));
    }

    let expand = |words: &Vec<String>| -> Vec<String> {
        words
            .iter()
            .map(|word| expand_references(word, &environment))
            .collect()
    };
    let program = match source {
        // As in a real container: `command` replaces the image's entrypoint (here
        // the binary itself, so its first word is dropped), `args` follow it.
        ImageSource::Binary(binary) => Program::Binary {
            binary,
            arguments: container
                .command
                .iter()
                .flatten()
                .skip(1)
                .chain(container.args.iter().flatten())
                .map(|argument| expand_references(argument, &environment))
                .collect(),
        },
        ImageSource::OciArchive(archive) => Program::Image {
            archive,
            container: Box::new(ContainerRun {
                command: container.command.as_ref().map(expand),
                args: container.args.as_ref().map(expand),
                working_dir: container.working_dir.clone(),
                security: Security::of(pod, container)?,
                mounts: volume_mounts(pod, container)?,
                host_network,
                hostname: pod_name.clone(),
            }),
        },
    };

    let service_account_secret = if pod_spec.automount_service_account_token == Some(false) {
        None
    } else {
        container
            .volume_mounts
            .iter()
            .flatten()
            .find(|mount| mount.mount_path.trim_end_matches('/') == SERVICE_ACCOUNT_MOUNT_PATH)
            .and_then(|mount| {
                pod_spec
                    .volumes
                    .iter()
                    .flatten()
                    .find(|volume| volume.name == mount.name)
            })
            .and_then(|volume| volume.secret.as_ref())
            .and_then(|secret| secret.secret_name.clone())
    };

    // A deletion's grace period counts when it is positive; 0 is how the
    // hollow kubelet finishes a deletion once its fake container is gone, so
    // the pod's own grace period applies then.
    let grace_seconds = pod
        .metadata
        .deletion_grace_period_seconds
        .filter(|seconds| *seconds > 0)
        .or(pod_spec.termination_grace_period_seconds)
        .map(|seconds| Duration::from_secs(seconds.max(0) as u64))
        .unwrap_or(DEFAULT_GRACE_PERIOD);

    Ok(ProcessSpec {
        key: ProcessKey {
            pod_uid: uid,
            container: container.name.clone(),
        },
        owner_key: owner_key(pod, &container.name),
        namespace,
        pod_name,
        node: node.to_string(),
        image,
        program,
        environment,
        run_to_completion: false,
        after: Vec::new(),
        service_account_secret,
        network_namespace,
        grace_period: grace_seconds,
        deleting: pod.metadata.deletion_timestamp.is_some(),
    })
}

/// The network namespace a pod's processes run in, from [`NETWORK_NAMESPACE_ANNOTATION`]: a
/// plain name (it is joined to `/run/netns`), and never for a `hostNetwork` pod.
fn network_namespace(pod: &Pod, host_network: bool) -> Result<Option<String>, SpecProblem> {
    let Some(name) = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|annotations| annotations.get(NETWORK_NAMESPACE_ANNOTATION))
    else {
        return Ok(None);
    };
    if host_network {
        return Err(SpecProblem::InvalidNetworkNamespace(
            "a hostNetwork pod runs in its node's network namespace".into(),
        ));
    }
    let plain = !name.is_empty()
        && name.len() <= 64
        && name != "."
        && name != ".."
        && name
            .chars()
            .all(|character| character.is_ascii_alphanumeric() || "-_.".contains(character));
    if !plain {
        return Err(SpecProblem::InvalidNetworkNamespace(format!(
            "{name:?} is not a plain namespace name"
        )));
    }
    Ok(Some(name.clone()))
}

/// The variables a kubelet gives every container for a Service (it does so for the
/// `kubernetes` Service in every pod): `<NAME>_SERVICE_HOST` (the ClusterIP),
/// `<NAME>_SERVICE_PORT` (the first port), `<NAME>_SERVICE_PORT_<PORT NAME>` per named port,
/// and Docker's link variables (`<NAME>_PORT=tcp://ip:port` of the first port, and
/// `<NAME>_PORT_<port>_<PROTOCOL>` with `_PROTO`, `_PORT` and `_ADDR` per port). Names are
/// upper case with `-` as `_`. A Service without a ClusterIP (headless) or ports gives none.
pub fn service_environment(service: &k8s_openapi::api::core::v1::Service) -> Vec<(String, String)> {
    let variable_name = |text: &str| text.replace('-', "_").to_ascii_uppercase();
    let Some(spec) = service.spec.as_ref() else {
        return Vec::new();
    };
    let cluster_ip = match spec.cluster_ip.as_deref() {
        Some(ip) if !ip.is_empty() && ip != "None" => ip,
        _ => return Vec::new(),
    };
    let ports = spec.ports.as_deref().unwrap_or_default();
    let Some(first) = ports.first() else {
        return Vec::new();
    };
    let prefix = variable_name(service.metadata.name.as_deref().unwrap_or_default());
    let mut environment = vec![
        (format!("{prefix}_SERVICE_HOST"), cluster_ip.to_string()),
        (format!("{prefix}_SERVICE_PORT"), first.port.to_string()),
    ];
    for port in ports {
        if let Some(name) = port.name.as_deref().filter(|name| !name.is_empty()) {
            environment.push((
                format!("{prefix}_SERVICE_PORT_{}", variable_name(name)),
                port.port.to_string(),
            ));
        }
    }
    // An IPv6 ClusterIP is bracketed in a URL.
    let host_port = |port: i32| match cluster_ip.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V6(_)) => format!("[{cluster_ip}]:{port}"),
        _ => format!("{cluster_ip}:{port}"),
    };
    for (index, port) in ports.iter().enumerate() {
        let protocol = port.protocol.as_deref().unwrap_or("TCP");
        let url = format!(
            "{}://{}",
            protocol.to_ascii_lowercase(),
            host_port(port.port)
        );
        if index == 0 {
            environment.push((format!("{prefix}_PORT"), url.clone()));
        }
        let port_prefix = format!(
            "{prefix}_PORT_{}_{}",
            port.port,
            protocol.to_ascii_uppercase()
        );
        environment.push((
            format!("{port_prefix}_PROTO"),
            protocol.to_ascii_lowercase(),
        ));
        environment.push((format!("{port_prefix}_PORT"), port.port.to_string()));
        environment.push((format!("{port_prefix}_ADDR"), cluster_ip.to_string()));
        environment.push((port_prefix, url));
    }
    environment
}

/// The downward API's `fieldRef` values.
fn field_value(
    pod: &Pod,
    path: &str,
    node: &str,
    node_address: &str,
    pod_ip: &str,
) -> Result<String, SpecProblem> {
    let metadata = &pod.metadata;
    let lookup = |map: &Option<BTreeMap<String, String>>, key: &str| {
        map.as_ref()
            .and_then(|map| map.get(key))
            .cloned()
            .unwrap_or_default()
    };
    let bracketed = |prefix: &str| {
        path.strip_prefix(prefix)
            .and_then(|rest| rest.strip_suffix("']"))
            .map(str::to_string)
    };
    Ok(match path {
        "metadata.name" => metadata.name.clone().unwrap_or_default(),
        "metadata.namespace" => metadata.namespace.clone().unwrap_or_default(),
        "metadata.uid" => metadata.uid.clone().unwrap_or_default(),
        "spec.nodeName" => node.to_string(),
        "spec.serviceAccountName" => pod
            .spec
            .as_ref()
            .and_then(|spec| spec.service_account_name.clone())
            .unwrap_or_default(),
        "status.hostIP" => node_address.to_string(),
        "status.podIP" | "status.podIPs" => pod_ip.to_string(),
        _ => {
            if let Some(key) = bracketed("metadata.labels['") {
                lookup(&metadata.labels, &key)
            } else if let Some(key) = bracketed("metadata.annotations['") {
                lookup(&metadata.annotations, &key)
            } else {
                return Err(SpecProblem::UnsupportedFieldPath(path.to_string()));
            }
        }
    })
}

/// Kubernetes' `$(NAME)` expansion in values and arguments: a defined
/// variable is replaced, `$$` is a literal `$`, anything else stays as written.
pub fn expand_references(text: &str, environment: &[(String, String)]) -> String {
    let mut expanded = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(position) = rest.find('$') {
        expanded.push_str(&rest[..position]);
        let after = &rest[position + 1..];
        if let Some(stripped) = after.strip_prefix('$') {
            expanded.push('$');
            rest = stripped;
        } else if let Some(inner) = after.strip_prefix('(') {
            match inner.find(')') {
                Some(end) => {
                    let name = &inner[..end];
                    match environment
                        .iter()
                        .rev()
                        .find(|(candidate, _)| candidate == name)
                    {
                        Some((_, value)) => expanded.push_str(value),
                        None => {
                            expanded.push_str("$(");
                            expanded.push_str(name);
                            expanded.push(')');
                        }
                    }
                    rest = &inner[end + 1..];
                }
                None => {
                    expanded.push_str("$(");
                    rest = inner;
                }
            }
        } else {
            expanded.push('$');
            rest = after;
        }
    }
    expanded.push_str(rest);
    expanded
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn images() -> ImageTable {
        ImageTable::parse(
            "registry.k8s.io/kube-proxy:v1.20.2 /cache/kube-proxy\n",
            Path::new("t"),
        )
        .unwrap()
    }

    /// The `kubernetes` Service as the 1.20 API server creates it.
    fn kubernetes_service() -> k8s_openapi::api::core::v1::Service {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "kubernetes", "namespace": "default"},
            "spec": {"clusterIP": "10.96.0.1", "type": "ClusterIP",
                     "ports": [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": 6443}]}
        }))
        .unwrap()
    }

    fn context() -> RunnerContext {
        RunnerContext {
            kubernetes_service_environment: Some(service_environment(&kubernetes_service())),
            node_addresses: [("node-2".to_string(), "10.99.0.12".to_string())].into(),
        }
    }

    fn kube_proxy_pod() -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "kube-proxy-abcde", "namespace": "kube-system", "uid": "uid-1",
                "labels": {"controller-revision-hash": "7f9c", "k8s-app": "kube-proxy"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "kube-proxy",
                                     "uid": "ds-uid", "controller": true}]
            },
            "spec": {
                "nodeName": "node-2", "hostNetwork": true, "serviceAccountName": "kube-proxy",
                "terminationGracePeriodSeconds": 5,
                "containers": [{
                    "name": "kube-proxy", "image": "registry.k8s.io/kube-proxy:v1.20.2",
                    "command": ["/usr/local/bin/kube-proxy", "--hostname-override=$(NODE_NAME)"],
                    "args": ["--bind-address=$(NODE_IP)", "--literal=$$(NODE_NAME)", "--unknown=$(NOPE)"],
                    "env": [
                        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                        {"name": "NODE_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
                        {"name": "REVISION", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['controller-revision-hash']"}}},
                        {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "mode"}}},
                        {"name": "GREETING", "value": "on $(NODE_NAME)"}
                    ],
                    "volumeMounts": [{"name": "kube-proxy-token-x", "mountPath": SERVICE_ACCOUNT_MOUNT_PATH, "readOnly": true}]
                }, {
                    "name": "sidecar", "image": "busybox"
                }],
                "volumes": [{"name": "kube-proxy-token-x", "secret": {"secretName": "kube-proxy-token-x"}}]
            },
            "status": {"phase": "Running", "hostIP": "10.99.0.12", "podIP": "10.99.0.12"}
        }))
        .unwrap()
    }

    fn values() -> BTreeMap<ObjectKeyReference, String> {
        [(
            ObjectKeyReference::ConfigMap {
                name: "settings".into(),
                key: "mode".into(),
            },
            "iptables".to_string(),
        )]
        .into()
    }

    fn environment_value<'a>(spec: &'a ProcessSpec, name: &str) -> Option<&'a str> {
        spec.environment
            .iter()
            .find(|(candidate, _)| candidate == name)
            .map(|(_, value)| value.as_str())
    }

    #[test]
    fn a_daemonset_pod_becomes_its_binary_with_the_downward_api_resolved() {
        let specs = process_specs(&kube_proxy_pod(), &images(), &context(), &values());
        assert_eq!(specs.len(), 1, "only the managed container runs");
        let spec = specs[0].clone().unwrap();
        let Program::Binary { binary, arguments } = &spec.program else {
            panic!("kube-proxy's image is a binary: {:?}", spec.program);
        };
        assert_eq!(binary, &PathBuf::from("/cache/kube-proxy"));
        assert_eq!(
            arguments,
            &vec![
                "--hostname-override=node-2",
                "--bind-address=10.99.0.12",
                "--literal=$(NODE_NAME)",
                "--unknown=$(NOPE)"
            ]
        );
        assert_eq!(environment_value(&spec, "REVISION"), Some("7f9c"));
        assert_eq!(environment_value(&spec, "MODE"), Some("iptables"));
        assert_eq!(environment_value(&spec, "GREETING"), Some("on node-2"));
        assert_eq!(
            environment_value(&spec, "KUBERNETES_SERVICE_HOST"),
            Some("10.96.0.1")
        );
        assert_eq!(
            environment_value(&spec, "KUBERNETES_SERVICE_PORT"),
            Some("443")
        );
        assert_eq!(environment_value(&spec, "HOSTNAME"), Some("node-2"));
        assert_eq!(spec.network_namespace, None);
        assert_eq!(
            spec.service_account_secret.as_deref(),
            Some("kube-proxy-token-x")
        );
        assert_eq!(spec.grace_period, Duration::from_secs(5));
        assert_eq!(
            spec.owner_key,
            "daemonset/kube-system/kube-proxy/node-2/kube-proxy"
        );
        assert!(!spec.deleting);
    }

    #[test]
    fn every_container_gets_the_kubernetes_services_variables_as_a_kubelet_gives_them() {
        let mut environment = service_environment(&kubernetes_service());
        environment.sort();
        let expected: Vec<(String, String)> = [
            ("KUBERNETES_PORT", "tcp://10.96.0.1:443"),
            ("KUBERNETES_PORT_443_TCP", "tcp://10.96.0.1:443"),
            ("KUBERNETES_PORT_443_TCP_ADDR", "10.96.0.1"),
            ("KUBERNETES_PORT_443_TCP_PORT", "443"),
            ("KUBERNETES_PORT_443_TCP_PROTO", "tcp"),
            ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
            ("KUBERNETES_SERVICE_PORT", "443"),
            ("KUBERNETES_SERVICE_PORT_HTTPS", "443"),
        ]
        .iter()
        .map(|(name, value)| (name.to_string(), value.to_string()))
        .collect();
        assert_eq!(environment, expected);
    }

    #[test]
    fn a_headless_or_portless_service_gives_no_variables() {
        let mut headless = kubernetes_service();
        headless.spec.as_mut().unwrap().cluster_ip = Some("None".into());
        assert!(service_environment(&headless).is_empty());
        let mut portless = kubernetes_service();
        portless.spec.as_mut().unwrap().ports = Some(Vec::new());
        assert!(service_environment(&portless).is_empty());
    }

    #[test]
    fn a_containers_own_api_server_variables_win_over_the_services() {
        let mut pod = kube_proxy_pod();
        pod.spec.as_mut().unwrap().containers[0]
            .env
            .as_mut()
            .unwrap()
            .extend(
                serde_json::from_value::<Vec<EnvVar>>(serde_json::json!([
                    {"name": "KUBERNETES_SERVICE_HOST", "value": "10.99.0.1"},
                    {"name": "KUBERNETES_SERVICE_PORT", "value": "6443"},
                    {"name": "API", "value": "$(KUBERNETES_SERVICE_HOST):$(KUBERNETES_SERVICE_PORT_HTTPS)"}
                ]))
                .unwrap(),
            );
        let spec = process_specs(&pod, &images(), &context(), &values())[0]
            .clone()
            .unwrap();
        let hosts: Vec<&str> = spec
            .environment
            .iter()
            .filter(|(name, _)| name == "KUBERNETES_SERVICE_HOST")
            .map(|(_, value)| value.as_str())
            .collect();
        assert_eq!(hosts, vec!["10.99.0.1"], "one value, the container's");
        assert_eq!(
            environment_value(&spec, "KUBERNETES_SERVICE_PORT"),
            Some("6443")
        );
        // The Service's other variables stay, and expand in the container's values.
        assert_eq!(environment_value(&spec, "API"), Some("10.99.0.1:443"));
    }

    #[test]
    fn no_process_starts_before_the_kubernetes_service_is_known() {
        let unknown = RunnerContext {
            kubernetes_service_environment: None,
            ..context()
        };
        let (key, problem) = process_specs(&kube_proxy_pod(), &images(), &unknown, &values())[0]
            .clone()
            .unwrap_err();
        assert_eq!(key.container, "kube-proxy");
        assert_eq!(problem, SpecProblem::KubernetesServiceUnknown);
    }

    #[test]
    fn a_pod_annotated_with_a_network_namespace_runs_there_unless_it_is_host_network() {
        let annotated = |name: &str, host_network: bool| {
            let mut pod = kube_proxy_pod();
            pod.metadata.annotations =
                Some([(NETWORK_NAMESPACE_ANNOTATION.to_string(), name.to_string())].into());
            pod.spec.as_mut().unwrap().host_network = Some(host_network);
            process_specs(&pod, &images(), &context(), &values())[0].clone()
        };
        let spec = annotated("api-probe", false).unwrap();
        assert_eq!(spec.network_namespace.as_deref(), Some("api-probe"));
        assert_eq!(
            environment_value(&spec, "HOSTNAME"),
            Some("kube-proxy-abcde")
        );
        for (name, host_network) in [("api-probe", true), ("../node-1", false), ("", false)] {
            let (_, problem) = annotated(name, host_network).unwrap_err();
            assert!(
                matches!(problem, SpecProblem::InvalidNetworkNamespace(_)),
                "{name:?} (hostNetwork {host_network}): {problem:?}"
            );
        }
    }

    #[test]
    fn a_positive_deletion_grace_period_counts_and_zero_falls_back_to_the_pods_own() {
        let mut pod = kube_proxy_pod();
        pod.metadata.deletion_grace_period_seconds = Some(2);
        let spec = process_specs(&pod, &images(), &context(), &values())[0]
            .clone()
            .unwrap();
        assert_eq!(spec.grace_period, Duration::from_secs(2));
        pod.metadata.deletion_grace_period_seconds = Some(0);
        let spec = process_specs(&pod, &images(), &context(), &values())[0]
            .clone()
            .unwrap();
        assert_eq!(spec.grace_period, Duration::from_secs(5));
    }

    #[test]
    fn a_missing_config_map_value_is_a_problem_not_an_empty_value() {
        let specs = process_specs(&kube_proxy_pod(), &images(), &context(), &BTreeMap::new());
        let (key, problem) = specs[0].clone().unwrap_err();
        assert_eq!(key.container, "kube-proxy");
        assert!(matches!(problem, SpecProblem::MissingReference(_)));
        assert_eq!(
            references(&kube_proxy_pod(), &images()),
            values().into_keys().collect::<Vec<_>>()
        );
    }

    #[test]
    fn unbound_finished_and_unmanaged_pods_run_nothing() {
        let mut unbound = kube_proxy_pod();
        unbound.spec.as_mut().unwrap().node_name = None;
        assert!(process_specs(&unbound, &images(), &context(), &values()).is_empty());
        let mut finished = kube_proxy_pod();
        finished.status.as_mut().unwrap().phase = Some("Succeeded".into());
        assert!(process_specs(&finished, &images(), &context(), &values()).is_empty());
        assert!(process_specs(
            &kube_proxy_pod(),
            &ImageTable::default(),
            &context(),
            &values()
        )
        .is_empty());
    }

    #[test]
    fn replica_set_pods_share_one_owner_key_per_deployment() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "operator-5d8f-x", "namespace": "switchyard-system",
                         "labels": {"pod-template-hash": "5d8f"},
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                              "name": "operator-5d8f", "uid": "u", "controller": true}]},
            "spec": {"containers": []}
        }))
        .unwrap();
        assert_eq!(
            owner_key(&pod, "operator"),
            "deployment/switchyard-system/operator/operator"
        );
    }

    #[test]
    fn expansion_follows_kubernetes_rules() {
        let environment = vec![("A".to_string(), "1".to_string())];
        assert_eq!(expand_references("x$(A)y", &environment), "x1y");
        assert_eq!(expand_references("$$(A)", &environment), "$(A)");
        assert_eq!(expand_references("$(B)", &environment), "$(B)");
        assert_eq!(expand_references("$(A", &environment), "$(A");
        assert_eq!(expand_references("cost $5", &environment), "cost $5");
    }
}
