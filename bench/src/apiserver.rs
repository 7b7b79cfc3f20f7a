//! etcd and a Kubernetes 1.20 API server in the bench's outer namespace (no
//! controllers, no kubelets), the Services and EndpointSlices the data plane is
//! measured with, and the same objects as manifest files for `standalone`.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use futures::{StreamExt as _, TryStreamExt as _};
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::{Api, Client};

use crate::error::{Error, Result};
use crate::topology::{
    backend_address, service_address, service_is_tcp, Process, BACKEND_TCP_PORT, BACKEND_UDP_PORT,
    SERVICE_TCP_PORT, SERVICE_UDP_PORT,
};

pub const SECURE_PORT: u16 = 6443;

/// The API server's flags that name no file of this control plane.
const API_SERVER_FLAGS: [&str; 16] = [
    "--etcd-servers=http://127.0.0.1:2379",
    // Every address of the private namespace (loopback and the nodes' uplinks).
    "--bind-address=0.0.0.0",
    "--advertise-address=127.0.0.1",
    "--insecure-port=0",
    "--authorization-mode=AlwaysAllow",
    "--service-cluster-ip-range=10.96.0.0/16",
    "--service-account-issuer=https://kubernetes.default.svc",
    "--api-audiences=https://kubernetes.default.svc",
    "--endpoint-reconciler-type=none",
    "--enable-priority-and-fairness=false",
    "--max-requests-inflight=2000",
    "--max-mutating-requests-inflight=1000",
    "--audit-log-format=json",
    "--audit-log-mode=batch",
    "--profiling=false",
    "--v=1",
];

/// Bearer tokens of the API server's clients (all `system:masters`; separate
/// users so the audit log tells their requests apart).
pub const USERS: [&str; 5] = [
    "bench",
    "kube-proxy",
    "switchyard-agent",
    "switchyard-operator",
    "simulated-agents",
];
pub const NAMESPACE: &str = "default";

/// etcd and the API server, stopped on drop.
pub struct ControlPlane {
    pub etcd: Process,
    pub apiserver: Process,
    pub client: Client,
    pub audit_log: PathBuf,
    pub started_in: Duration,
}

impl ControlPlane {
    /// Starts both with data under `work/<name>` (a tmpfs), waits for readiness.
    pub async fn start(kubernetes_bin: &Path, work: &Path, name: &str) -> Result<Self> {
        let started = Instant::now();
        let directory = work.join(name);
        std::fs::create_dir_all(&directory).map_err(|error| {
            Error::ApiServer(format!("failed to create {}: {error}", directory.display()))
        })?;
        let etcd = Process::start(
            "etcd",
            None,
            &kubernetes_bin.join("etcd"),
            &[
                "--name=bench".into(),
                format!("--data-dir={}", directory.join("etcd").display()),
                "--listen-client-urls=http://127.0.0.1:2379".into(),
                "--advertise-client-urls=http://127.0.0.1:2379".into(),
                "--listen-peer-urls=http://127.0.0.1:2380".into(),
                "--initial-advertise-peer-urls=http://127.0.0.1:2380".into(),
                "--initial-cluster=bench=http://127.0.0.1:2380".into(),
                "--quota-backend-bytes=8589934592".into(),
                "--unsafe-no-fsync".into(),
            ],
            &[],
            &directory.join("etcd.log"),
        )?;
        let key = directory.join("service-account.key");
        crate::topology::sh(&format!(
            "openssl genrsa -out {} 2048 2>/dev/null",
            key.display()
        ))?;
        let tokens: String = USERS
            .iter()
            .map(|user| format!("{},{user},{user},system:masters\n", token(user)))
            .collect();
        std::fs::write(directory.join("tokens.csv"), tokens).map_err(|error| {
            Error::ApiServer(format!("failed to write the token file: {error}"))
        })?;
        for user in USERS {
            for (suffix, host) in [
                ("", "127.0.0.1"),
                ("-node", &crate::topology::CONTROL_ADDRESS.to_string()[..]),
            ] {
                let path = kubeconfig_path(work, user, suffix);
                std::fs::write(&path, kubeconfig(host, user)).map_err(|error| {
                    Error::ApiServer(format!("failed to write {}: {error}", path.display()))
                })?;
            }
        }
        let policy = directory.join("audit-policy.yaml");
        std::fs::write(
            &policy,
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n- level: Metadata\n",
        )
        .map_err(|error| Error::ApiServer(format!("failed to write the audit policy: {error}")))?;
        let audit_log = directory.join("audit.log");
        let apiserver = Process::start(
            "kube-apiserver",
            None,
            &kubernetes_bin.join("kube-apiserver"),
            &[
                API_SERVER_FLAGS
                    .iter()
                    .map(|flag| flag.to_string())
                    .collect(),
                vec![
                    format!("--secure-port={SECURE_PORT}"),
                    format!(
                        "--token-auth-file={}",
                        directory.join("tokens.csv").display()
                    ),
                    format!("--cert-dir={}", directory.join("certs").display()),
                    format!("--service-account-key-file={}", key.display()),
                    format!("--service-account-signing-key-file={}", key.display()),
                    format!("--audit-policy-file={}", policy.display()),
                    format!("--audit-log-path={}", audit_log.display()),
                ],
            ]
            .concat(),
            &[],
            &directory.join("kube-apiserver.log"),
        )?;
        let client = client(work, "bench").await?;
        let deadline = Instant::now() + Duration::from_secs(90);
        let mut apiserver = apiserver;
        loop {
            if Instant::now() > deadline || !apiserver.is_running() {
                let log = apiserver.log_text();
                let tail: Vec<&str> = log.lines().rev().take(15).collect();
                return Err(Error::ApiServer(format!(
                    "failed to see the API server ready within 90 s; last lines:\n{}",
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                )));
            }
            if client.apiserver_version().await.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        // The default namespace is created by a post-start hook, shortly after readiness.
        let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
        let deadline = Instant::now() + Duration::from_secs(30);
        while namespaces.get_opt(NAMESPACE).await.ok().flatten().is_none() {
            if Instant::now() > deadline {
                return Err(Error::ApiServer(
                    "failed to see the default namespace within 30 s".into(),
                ));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Ok(Self {
            etcd,
            apiserver,
            client,
            audit_log,
            started_in: started.elapsed(),
        })
    }

    /// Sets the nice value of every thread of etcd and the API server; returns how
    /// many were set. Threads they create later inherit it from their creator.
    pub fn set_nice(&self, nice: i32) -> Result<usize> {
        let mut set = 0;
        for pid in [self.etcd.pid(), self.apiserver.pid()]
            .into_iter()
            .flatten()
        {
            let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).map_err(|error| {
                Error::ApiServer(format!(
                    "failed to list the threads of process {pid}: {error}"
                ))
            })?;
            for thread_id in tasks
                .flatten()
                .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
            {
                // SAFETY: setpriority only reads its arguments; with PRIO_PROCESS and
                // a thread id it changes that one thread. A thread that exited
                // meanwhile is skipped.
                if unsafe { libc::setpriority(libc::PRIO_PROCESS as _, thread_id as _, nice) } == 0
                {
                    set += 1;
                }
            }
        }
        Ok(set)
    }

    pub fn stop(mut self) {
        self.apiserver.stop(Duration::from_secs(5));
        self.etcd.stop(Duration::from_secs(5));
    }
}

/// A fixed token per user: the API server lives only as long as the bench's
/// private namespaces, where nothing else can reach it.
pub fn token(user: &str) -> String {
    format!("switchyard-bench-{user}-token")
}

/// `<work>/<user>[-node].kubeconfig`: `-node` reaches the server from a node namespace.
pub fn kubeconfig_path(work: &Path, user: &str, suffix: &str) -> PathBuf {
    work.join(format!("{user}{suffix}.kubeconfig"))
}

fn kubeconfig(host: &str, user: &str) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: bench
  cluster: {{server: \"https://{host}:{SECURE_PORT}\", insecure-skip-tls-verify: true}}
users:
- name: {user}
  user: {{token: {}}}
contexts:
- name: bench
  context: {{cluster: bench, user: {user}}}
current-context: bench
",
        token(user)
    )
}

pub async fn client(work: &Path, user: &str) -> Result<Client> {
    let path = kubeconfig_path(work, user, "");
    let kubeconfig = kube::config::Kubeconfig::read_from(&path)
        .map_err(|error| Error::ApiServer(format!("failed to read {}: {error}", path.display())))?;
    let mut config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .map_err(|error| Error::ApiServer(format!("failed to load {}: {error}", path.display())))?;
    config.read_timeout = Some(Duration::from_secs(60));
    Client::try_from(config)
        .map_err(|error| Error::ApiServer(format!("failed to build a client: {error}")))
}

pub fn endpoint_slice_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("discovery.k8s.io", "v1beta1", "EndpointSlice"),
        "endpointslices",
    )
}

fn service_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("", "v1", "Service"), "services")
}

pub fn service_name(index: u32) -> String {
    format!("bench-{index}")
}

/// The Service with index `index`, as a JSON object.
pub fn service_object(index: u32) -> serde_json::Value {
    let (protocol, port, target) = if service_is_tcp(index) {
        ("TCP", SERVICE_TCP_PORT, BACKEND_TCP_PORT)
    } else {
        ("UDP", SERVICE_UDP_PORT, BACKEND_UDP_PORT)
    };
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": service_name(index), "namespace": NAMESPACE},
        "spec": {
            "type": "ClusterIP",
            "clusterIP": service_address(index).to_string(),
            "ports": [{"name": "p", "protocol": protocol, "port": port, "targetPort": target}],
        }
    })
}

/// Its EndpointSlice (v1beta1: the 1.20 API server has no v1), endpoints at `addresses`.
pub fn endpoint_slice_object(index: u32, addresses: &[Ipv4Addr]) -> serde_json::Value {
    let (protocol, port) = if service_is_tcp(index) {
        ("TCP", BACKEND_TCP_PORT)
    } else {
        ("UDP", BACKEND_UDP_PORT)
    };
    serde_json::json!({
        "apiVersion": "discovery.k8s.io/v1beta1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": service_name(index),
            "namespace": NAMESPACE,
            "labels": {
                "kubernetes.io/service-name": service_name(index),
                "endpointslice.kubernetes.io/managed-by": "switchyard-bench",
            },
        },
        "addressType": "IPv4",
        "ports": [{"name": "p", "protocol": protocol, "port": port}],
        "endpoints": endpoint_list(addresses),
    })
}

fn endpoint_list(addresses: &[Ipv4Addr]) -> serde_json::Value {
    serde_json::Value::Array(
        addresses
            .iter()
            .map(|address| {
                serde_json::json!({
                    "addresses": [address.to_string()],
                    "conditions": {"ready": true},
                    "topology": {"kubernetes.io/hostname": "bench-node"},
                })
            })
            .collect(),
    )
}

pub fn backend_addresses(count: u32) -> Vec<Ipv4Addr> {
    (0..count).map(backend_address).collect()
}

fn dynamic(value: serde_json::Value) -> Result<DynamicObject> {
    serde_json::from_value(value)
        .map_err(|error| Error::Populate(format!("failed to build an object: {error}")))
}

/// Creates Services `from..to` and their slices, 64 requests in flight.
pub async fn create_services(client: &Client, from: u32, to: u32, backends: u32) -> Result<()> {
    let services: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), NAMESPACE, &service_resource());
    let slices: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), NAMESPACE, &endpoint_slice_resource());
    let addresses = backend_addresses(backends);
    futures::stream::iter(from..to)
        .map(|index| {
            let (services, slices, addresses) =
                (services.clone(), slices.clone(), addresses.clone());
            async move {
                let service = dynamic(service_object(index))?;
                create_or_keep(&services, &service).await?;
                let slice = dynamic(endpoint_slice_object(index, &addresses))?;
                create_or_keep(&slices, &slice).await
            }
        })
        .buffer_unordered(64)
        .try_collect::<Vec<()>>()
        .await
        .map(|_| ())
}

async fn create_or_keep(api: &Api<DynamicObject>, object: &DynamicObject) -> Result<()> {
    let mut attempt = 0;
    loop {
        match api.create(&PostParams::default(), object).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(status)) if status.code == 409 => return Ok(()),
            Err(error) if attempt < 5 => {
                attempt += 1;
                let _ = error;
                tokio::time::sleep(Duration::from_millis(200 * attempt)).await;
            }
            Err(error) => {
                return Err(Error::Populate(format!(
                    "failed to create {}: {error}",
                    object.metadata.name.clone().unwrap_or_default()
                )))
            }
        }
    }
}

/// Replaces the endpoints of Service `index`'s slice.
pub async fn set_endpoints(client: &Client, index: u32, addresses: &[Ipv4Addr]) -> Result<()> {
    let slices: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), NAMESPACE, &endpoint_slice_resource());
    let patch = serde_json::json!({"endpoints": endpoint_list(addresses)});
    slices
        .patch(
            &service_name(index),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .map_err(|error| {
            Error::Populate(format!(
                "failed to patch slice {}: {error}",
                service_name(index)
            ))
        })?;
    Ok(())
}

/// The node the data plane is measured on, as the agent's cluster mode needs it:
/// the CRDs, a Ready Node with the node's address, and its DataplaneNode in mode
/// `Ebpf` (what the operator would have written).
pub async fn prepare_node(client: &Client, node_name: &str, address: Ipv4Addr) -> Result<()> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use switchyard_crds::{DataplaneMode, DataplaneNode, DataplaneNodeSpec};
    let failed = |what: &str, error: kube::Error| {
        Error::Populate(format!("failed to create {what}: {error}"))
    };
    let definitions: Api<CustomResourceDefinition> = Api::all(client.clone());
    for definition in switchyard_crds::crds() {
        match definitions
            .create(&PostParams::default(), &definition)
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(error) => return Err(failed("the CustomResourceDefinitions", error)),
        }
        let name = definition.metadata.name.clone().unwrap_or_default();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let established = definitions.get(&name).await.ok().is_some_and(|definition| {
                definition
                    .status
                    .and_then(|status| status.conditions)
                    .is_some_and(|conditions| {
                        conditions
                            .iter()
                            .any(|c| c.type_ == "Established" && c.status == "True")
                    })
            });
            if established {
                break;
            }
            if Instant::now() > deadline {
                return Err(Error::Populate(format!(
                    "failed to see {name} established within 30 s"
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    let node = serde_json::from_value(serde_json::json!({
        "metadata": {"name": node_name, "labels": {"kubernetes.io/hostname": node_name}},
    }))
    .map_err(|error| Error::Populate(error.to_string()))?;
    nodes
        .create(&PostParams::default(), &node)
        .await
        .map_err(|error| failed("the Node", error))?;
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let status = serde_json::json!({"status": {
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                        "message": "bench", "lastHeartbeatTime": now, "lastTransitionTime": now}],
        "addresses": [{"type": "InternalIP", "address": address.to_string()},
                      {"type": "Hostname", "address": node_name}],
    }});
    nodes
        .patch_status(node_name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .map_err(|error| failed("the Node's status", error))?;
    let dataplane_nodes: Api<DataplaneNode> = Api::all(client.clone());
    let dataplane_node = DataplaneNode::new(node_name, DataplaneNodeSpec::new(DataplaneMode::Ebpf));
    dataplane_nodes
        .create(&PostParams::default(), &dataplane_node)
        .await
        .map_err(|error| failed("the DataplaneNode", error))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tcp_services_slice_points_at_the_tcp_backends_with_the_services_label() {
        let slice = endpoint_slice_object(4, &backend_addresses(2));
        assert_eq!(
            slice["metadata"]["labels"]["kubernetes.io/service-name"],
            "bench-4"
        );
        assert_eq!(slice["ports"][0]["protocol"], "TCP");
        assert_eq!(slice["ports"][0]["port"], 8080);
        assert_eq!(slice["endpoints"][1]["addresses"][0], "10.244.0.12");
        let service = service_object(5);
        assert_eq!(service["spec"]["ports"][0]["protocol"], "UDP");
        assert_eq!(service["spec"]["clusterIP"], service_address(5).to_string());
    }
}
