//! switchyard-e2e-pod-runner: runs the real processes of pods on hollow nodes.
//!
//! Started by `e2e/cluster up` inside the cluster's namespaces. It watches all
//! pods bound to a node; for every container whose image is in the image
//! table it runs, inside that node's network and mount namespaces (entered
//! through the node's holder process):
//! - for an image mapped to a binary, the binary as a plain process, in a mount
//!   namespace of its own where the pod's service-account credentials appear at
//!   the usual path;
//! - for an image mapped to an OCI archive, the container from its image with an
//!   OCI runtime (crun), with its securityContext and volumes, as a kubelet would
//!   (`switchyard_e2e::pod_runner::container`).
//!
//! The decisions are `switchyard_e2e::pod_runner::plan`'s; this file only does
//! the I/O.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Service};
use kube::runtime::{reflector, watcher, WatchStreamExt};
use kube::{Api, Client};
use switchyard_e2e::cluster::{self, ClusterPaths};
use switchyard_e2e::error::{E2eError, Result};
use switchyard_e2e::images::ImageTable;
use switchyard_e2e::netns::named_namespace_path;
use switchyard_e2e::pod_runner::bundle::{held_capabilities, write_bundle, BundleInputs};
use switchyard_e2e::pod_runner::container::ContainerRun;
use switchyard_e2e::pod_runner::events::{append_event, now_unix_ms, EventKind, RunnerEvent};
use switchyard_e2e::pod_runner::image_store;
use switchyard_e2e::pod_runner::plan::{plan, Action, ProcessState, Tracked, Wanted};
use switchyard_e2e::pod_runner::spec::{
    process_specs, references, service_environment, ObjectKeyReference, ProcessKey, ProcessSpec,
    Program, RunnerContext,
};
use tracing::{info, warn};

#[derive(Debug, Parser)]
#[command(about = "Runs the real processes of pods on the e2e cluster's hollow nodes")]
struct Arguments {
    /// The cluster's state directory.
    #[arg(long)]
    state_dir: PathBuf,
    /// The administrator's kubeconfig.
    #[arg(long)]
    kubeconfig: PathBuf,
    /// The image table.
    #[arg(long)]
    images: PathBuf,
    /// Where images' root filesystems are unpacked, under their manifest digests.
    #[arg(long)]
    rootfs_cache: Option<PathBuf>,
    /// The OCI runtime.
    #[arg(long, default_value = "crun")]
    runtime: String,
}

/// A process the runner started and what it knows of it.
struct Managed {
    tracked: Tracked,
    spec: ProcessSpec,
    child: Option<tokio::process::Child>,
    pid: Option<u32>,
}

struct Runner {
    client: Client,
    paths: ClusterPaths,
    images: ImageTable,
    rootfs_cache: PathBuf,
    runtime: String,
    /// The capabilities this runner holds, the most a container can get.
    held_capabilities: BTreeSet<String>,
    context: RunnerContext,
    processes: BTreeMap<ProcessKey, Managed>,
    started: tokio::time::Instant,
    reported_problems: BTreeSet<String>,
}

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
    let arguments = Arguments::parse();
    if let Err(error) = run(arguments).await {
        eprintln!("switchyard-e2e-pod-runner: {error}");
        std::process::exit(1);
    }
}

async fn run(arguments: Arguments) -> Result<()> {
    let paths = ClusterPaths::from_state_override(Some(arguments.state_dir.clone()));
    let client = cluster::client_from_kubeconfig(&arguments.kubeconfig).await?;
    let images = ImageTable::read(&arguments.images)?;
    info!(
        entries = images.len(),
        "image table loaded from {}",
        arguments.images.display()
    );
    let held_capabilities = held_capabilities().map_err(|source| E2eError::ReadFile {
        path: PathBuf::from("/proc/self/status"),
        source,
    })?;
    let rootfs_cache = arguments.rootfs_cache.clone().unwrap_or_else(|| {
        std::env::var_os("HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/root"))
            .join(".cache/switchyard/e2e-rootfs")
    });
    let mut runner = Runner {
        client: client.clone(),
        rootfs_cache,
        runtime: arguments.runtime.clone(),
        held_capabilities,
        context: RunnerContext {
            kubernetes_service_environment: None,
            node_addresses: BTreeMap::new(),
        },
        paths,
        images,
        processes: BTreeMap::new(),
        started: tokio::time::Instant::now(),
        reported_problems: BTreeSet::new(),
    };

    // Pods bound to a node, kept in a store by a list+watch (no streaming
    // lists: the 1.20 API server does not serve them).
    let (store, writer) = reflector::store::<Pod>();
    let changed = Arc::new(tokio::sync::Notify::new());
    let notify = changed.clone();
    let pods: Api<Pod> = Api::all(client);
    let watch = reflector(
        writer,
        watcher(pods, watcher::Config::default().fields("spec.nodeName!=")),
    )
    .default_backoff();
    tokio::spawn(async move {
        let mut watch = watch.boxed();
        while let Some(event) = watch.next().await {
            match event {
                Ok(_) => notify.notify_one(),
                Err(error) => warn!("failed to watch pods: {error}"),
            }
        }
    });
    store
        .wait_until_ready()
        .await
        .map_err(|error| E2eError::WatchPods {
            message: error.to_string(),
        })?;
    info!("watching pods");
    loop {
        runner.reconcile(&store.state()).await;
        tokio::select! {
            _ = changed.notified() => {}
            _ = tokio::time::sleep(Duration::from_millis(250)) => {}
        }
    }
}

impl Runner {
    fn now(&self) -> Duration {
        self.started.elapsed()
    }

    fn refresh_node_addresses(&mut self) {
        let Ok(entries) = std::fs::read_dir(self.paths.state.join("nodes")) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Ok(address) = self.paths.node_address(&name) {
                self.context.node_addresses.insert(name, address);
            }
        }
    }

    /// Reads the `kubernetes` Service once: its ClusterIP and port become every process's
    /// KUBERNETES_SERVICE_HOST/PORT, as a kubelet gives them (the Service is created by the
    /// API server at start and its ClusterIP never changes).
    async fn read_kubernetes_service(&mut self) {
        let services = Api::<Service>::namespaced(self.client.clone(), "default");
        let problem = match services.get_opt("kubernetes").await {
            Ok(Some(service)) => {
                let environment = service_environment(&service);
                if environment.is_empty() {
                    "it has no ClusterIP or port".to_string()
                } else {
                    info!(?environment, "the kubernetes Service's variables");
                    self.context.kubernetes_service_environment = Some(environment);
                    return;
                }
            }
            Ok(None) => "it does not exist yet".to_string(),
            Err(error) => format!("failed to read it: {error}"),
        };
        let message = format!("the kubernetes Service: {problem}");
        if self.reported_problems.insert(message.clone()) {
            warn!("cannot start processes yet: {message}");
        }
    }

    async fn reconcile(&mut self, pods: &[Arc<Pod>]) {
        self.reap_exited();
        if self.context.node_addresses.is_empty() {
            self.refresh_node_addresses();
        }
        if self.context.kubernetes_service_environment.is_none() {
            self.read_kubernetes_service().await;
        }
        let mut wanted = Vec::new();
        let mut specs = BTreeMap::new();
        for pod in pods {
            let values = self.referenced_values(pod).await;
            for result in process_specs(pod, &self.images, &self.context, &values) {
                match result {
                    Ok(spec) => {
                        wanted.push(Wanted {
                            key: spec.key.clone(),
                            owner_key: spec.owner_key.clone(),
                            deleting: spec.deleting,
                            grace_period: spec.grace_period,
                            run_to_completion: spec.run_to_completion,
                            after: spec.after.clone(),
                        });
                        specs.insert(spec.key.clone(), spec);
                    }
                    Err((key, problem)) => {
                        let message = format!(
                            "pod {}/{} container {}: {problem}",
                            pod.metadata.namespace.as_deref().unwrap_or(""),
                            pod.metadata.name.as_deref().unwrap_or(""),
                            key.container
                        );
                        if self.reported_problems.insert(message.clone()) {
                            warn!("cannot start yet: {message}");
                            self.refresh_node_addresses();
                        }
                    }
                }
            }
        }
        let tracked: Vec<Tracked> = self
            .processes
            .values()
            .map(|managed| managed.tracked.clone())
            .collect();
        for action in plan(&wanted, &tracked, self.now()) {
            match action {
                Action::Start(key) => {
                    if let Some(spec) = specs.remove(&key) {
                        self.start(spec).await;
                    }
                }
                Action::Terminate(key, grace_period) => {
                    if let Some(managed) = self.processes.get_mut(&key) {
                        managed.tracked.grace_period = grace_period;
                    }
                    self.signal(&key, libc::SIGTERM)
                }
                Action::Kill(key) => self.signal(&key, libc::SIGKILL),
                Action::Forget(key) => {
                    self.processes.remove(&key);
                }
            }
        }
    }

    /// Values of config maps and secrets the pod's environment refers to.
    async fn referenced_values(&self, pod: &Pod) -> BTreeMap<ObjectKeyReference, String> {
        let mut values = BTreeMap::new();
        let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
        for reference in references(pod, &self.images) {
            let value = match &reference {
                ObjectKeyReference::ConfigMap { name, key } => {
                    Api::<ConfigMap>::namespaced(self.client.clone(), namespace)
                        .get_opt(name)
                        .await
                        .ok()
                        .flatten()
                        .and_then(|map| map.data.and_then(|data| data.get(key).cloned()))
                }
                ObjectKeyReference::Secret { name, key } => {
                    Api::<Secret>::namespaced(self.client.clone(), namespace)
                        .get_opt(name)
                        .await
                        .ok()
                        .flatten()
                        .and_then(|secret| secret.data.and_then(|data| data.get(key).cloned()))
                        .and_then(|bytes| String::from_utf8(bytes.0).ok())
                }
            };
            if let Some(value) = value {
                values.insert(reference, value);
            }
        }
        values
    }

    fn reap_exited(&mut self) {
        let now = self.now();
        let mut exited = Vec::new();
        for managed in self.processes.values_mut() {
            let Some(child) = managed.child.as_mut() else {
                continue;
            };
            match child.try_wait() {
                Ok(Some(status)) => {
                    managed.child = None;
                    managed.tracked.state = ProcessState::Exited {
                        at: now,
                        succeeded: status.success(),
                    };
                    exited.push((managed.spec.clone(), managed.pid, status.to_string()));
                }
                Ok(None) => {}
                Err(error) => warn!("failed to check process {:?}: {error}", managed.pid),
            }
        }
        for (spec, pid, status) in exited {
            info!(pod = %spec.pod_name, node = %spec.node, ?pid, "process exited: {status}");
            self.event(&spec, EventKind::Exited, pid, Some(status));
        }
    }

    fn event(&self, spec: &ProcessSpec, kind: EventKind, pid: Option<u32>, detail: Option<String>) {
        let event = RunnerEvent {
            at_unix_ms: now_unix_ms(),
            kind,
            namespace: spec.namespace.clone(),
            pod: spec.pod_name.clone(),
            pod_uid: spec.key.pod_uid.clone(),
            container: spec.key.container.clone(),
            node: spec.node.clone(),
            pid,
            detail,
        };
        if let Err(error) = append_event(&self.paths.pod_runner_events(), &event) {
            warn!("{error}");
        }
    }

    fn signal(&mut self, key: &ProcessKey, signal: i32) {
        let now = self.now();
        let Some(managed) = self.processes.get_mut(key) else {
            return;
        };
        let (kind, state) = if signal == libc::SIGKILL {
            (EventKind::Killed, ProcessState::Killed)
        } else {
            (
                EventKind::Terminating,
                ProcessState::Terminating { since: now },
            )
        };
        if let Some(pid) = managed.pid.filter(|_| managed.child.is_some()) {
            // SAFETY: kill(2) with a PID of a child this runner has not yet
            // reaped, so the PID cannot have been reused.
            unsafe { libc::kill(pid as libc::pid_t, signal) };
        }
        managed.tracked.state = state;
        let (spec, pid) = (managed.spec.clone(), managed.pid);
        info!(pod = %spec.pod_name, node = %spec.node, ?pid, "sent signal {signal}");
        self.event(&spec, kind, pid, None);
    }

    async fn start(&mut self, spec: ProcessSpec) {
        let now = self.now();
        let restarts = self
            .processes
            .get(&spec.key)
            .map(|managed| managed.tracked.restarts + 1)
            .unwrap_or(0);
        let result = self.spawn(&spec, restarts).await;
        let (child, pid, state) = match result {
            Ok((child, pid)) => {
                let program = spec.program.describe();
                info!(pod = %spec.pod_name, node = %spec.node, ?pid, %program, "started");
                self.event(&spec, EventKind::Started, pid, Some(program));
                (Some(child), pid, ProcessState::Running)
            }
            Err(error) => {
                warn!("{error}");
                self.event(&spec, EventKind::StartFailed, None, Some(error.to_string()));
                (
                    None,
                    None,
                    ProcessState::Exited {
                        at: now,
                        succeeded: false,
                    },
                )
            }
        };
        self.processes.insert(
            spec.key.clone(),
            Managed {
                tracked: Tracked {
                    key: spec.key.clone(),
                    owner_key: spec.owner_key.clone(),
                    state,
                    grace_period: spec.grace_period,
                    restarts,
                },
                spec,
                child,
                pid,
            },
        );
    }

    fn pod_directory(&self, spec: &ProcessSpec) -> PathBuf {
        self.paths.process_directory(
            &spec.namespace,
            &spec.pod_name,
            &spec.key.pod_uid,
            &spec.key.container,
        )
    }

    /// Writes the service-account files a container would see.
    async fn write_service_account(
        &self,
        spec: &ProcessSpec,
        secret_name: &str,
        directory: &Path,
    ) -> Result<()> {
        let secret = Api::<Secret>::namespaced(self.client.clone(), &spec.namespace)
            .get(secret_name)
            .await
            .map_err(|source| E2eError::Kubernetes {
                action: format!(
                    "read the service-account secret {}/{secret_name}",
                    spec.namespace
                ),
                source,
            })?;
        let data = secret.data.unwrap_or_default();
        std::fs::create_dir_all(directory).map_err(|source| E2eError::WriteFile {
            path: directory.to_path_buf(),
            source,
        })?;
        for file in ["token", "ca.crt", "namespace"] {
            let content = data
                .get(file)
                .map(|bytes| bytes.0.clone())
                .unwrap_or_default();
            if content.is_empty() && file != "namespace" {
                return Err(E2eError::ResolvePodProcess {
                    pod: format!("{}/{}", spec.namespace, spec.pod_name),
                    message: format!("the secret {secret_name} has no {file}"),
                });
            }
            let path = directory.join(file);
            std::fs::write(&path, content)
                .map_err(|source| E2eError::WriteFile { path, source })?;
        }
        Ok(())
    }

    /// Starts the container's process; gives its child (the binary, or the OCI runtime
    /// that runs the container) and the PID of the container's own process.
    async fn spawn(
        &self,
        spec: &ProcessSpec,
        start_number: u32,
    ) -> Result<(tokio::process::Child, Option<u32>)> {
        let pod = format!("{}/{}", spec.namespace, spec.pod_name);
        let holder = cluster_holder_pid(&self.paths, &spec.node)?;
        let directory = self.pod_directory(spec);
        std::fs::create_dir_all(&directory).map_err(|source| E2eError::WriteFile {
            path: directory.clone(),
            source,
        })?;
        let service_account_directory = match &spec.service_account_secret {
            Some(secret_name) => {
                let path = directory.join("serviceaccount");
                self.write_service_account(spec, secret_name, &path).await?;
                path.display().to_string()
            }
            None => String::new(),
        };
        let log_path = directory.join("output.log");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|source| E2eError::WriteFile {
                path: log_path.clone(),
                source,
            })?;
        let log_for_stderr = log.try_clone().map_err(|source| E2eError::WriteFile {
            path: log_path.clone(),
            source,
        })?;
        // The node's network namespace, or the pod's own when it names one (nsenter opens
        // it here, in the cluster's mount namespace, before entering the node's).
        let network = match &spec.network_namespace {
            Some(name) => {
                let path = named_namespace_path(name);
                if !path.exists() {
                    return Err(E2eError::ResolvePodProcess {
                        pod,
                        message: format!("its network namespace {} does not exist", path.display()),
                    });
                }
                format!("--net={}", path.display())
            }
            None => "-n".to_string(),
        };
        let (binary, arguments) = match &spec.program {
            Program::Binary { binary, arguments } => (binary, arguments),
            Program::Image { archive, container } => {
                let log = (log, log_for_stderr);
                return self
                    .spawn_container(
                        spec,
                        archive,
                        container,
                        ContainerStart {
                            holder,
                            network: &network,
                            directory: &directory,
                            service_account: spec
                                .service_account_secret
                                .as_ref()
                                .map(|_| PathBuf::from(&service_account_directory)),
                            log,
                            start_number,
                        },
                    )
                    .await;
            }
        };
        // The node's mount namespace, then a mount namespace of the process's own in
        // which its service-account directory is bound at the usual path.
        let mut command = tokio::process::Command::new("nsenter");
        command
            .arg("-t")
            .arg(holder.to_string())
            .arg(&network)
            .args(["-m", "--", "unshare", "-m", "--propagation", "private", "--", "/bin/sh", "-c"])
            .arg(concat!(
                "sa=$1; shift; ",
                "if [ -n \"$sa\" ]; then mount --bind \"$sa\" /var/run/secrets/kubernetes.io/serviceaccount || exit 97; fi; ",
                "exec \"$@\""
            ))
            .arg("switchyard-pod")
            .arg(&service_account_directory)
            .arg(binary)
            .args(arguments)
            .env_clear()
            .env("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
            .envs(spec.environment.iter().map(|(name, value)| (name, value)))
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log_for_stderr))
            .kill_on_drop(false);
        let child = command
            .spawn()
            .map_err(|source| E2eError::StartProcess { pod, source })?;
        let pid = child.id();
        Ok((child, pid))
    }

    /// Runs a container from its image: unpacked (cached), its bundle written, the OCI
    /// runtime started in the node's namespaces; waits for the container's process.
    async fn spawn_container(
        &self,
        spec: &ProcessSpec,
        archive: &Path,
        container: &ContainerRun,
        start: ContainerStart<'_>,
    ) -> Result<(tokio::process::Child, Option<u32>)> {
        let pod = format!("{}/{}", spec.namespace, spec.pod_name);
        let failed = |message: String| E2eError::ResolvePodProcess {
            pod: pod.clone(),
            message,
        };
        let (mut log, log_for_stderr) = start.log;
        let image = image_store::unpack(archive, &self.rootfs_cache)?;
        let pod_volumes = start
            .directory
            .parent()
            .unwrap_or(start.directory)
            .join("volumes");
        let nodes = self.paths.state.join("nodes");
        let bundle = write_bundle(&BundleInputs {
            holder: start.holder,
            run: container,
            image: &image,
            environment: &spec.environment,
            directory: start.directory,
            pod_volumes: &pod_volumes,
            service_account: start.service_account.as_deref(),
            hosts_file: &nodes.join("hosts"),
            resolv_conf: &nodes.join("resolv.conf"),
            held_capabilities: &self.held_capabilities,
            start_number: start.start_number,
        });
        let bundle = match bundle {
            Ok(bundle) => bundle,
            Err(message) => {
                // Where a kubelet's would show: the container's log here.
                use std::io::Write;
                let _ = writeln!(log, "switchyard-e2e-pod-runner: {message}");
                return Err(failed(message));
            }
        };
        if !bundle.withheld_capabilities.is_empty() {
            use std::io::Write;
            let message = format!(
                "this machine withholds {:?} from the runner, so the container runs without them",
                bundle.withheld_capabilities
            );
            warn!(%pod, container = %spec.key.container, "{message}");
            let _ = writeln!(log, "switchyard-e2e-pod-runner: {message}");
        }
        let container_id = container_id(spec, start.start_number);
        let runtime_root = self.paths.state.join("runtime");
        let mut command = tokio::process::Command::new("nsenter");
        command
            .arg("-t")
            .arg(start.holder.to_string())
            .arg(start.network)
            .args(["-m", "--"])
            .arg(&self.runtime)
            .arg("--root")
            .arg(&runtime_root)
            // The hollow nodes have no resource accounting: no cgroups per container.
            .arg("--cgroup-manager=disabled")
            .arg("run")
            .arg("--bundle")
            .arg(&bundle.directory)
            .arg(&container_id)
            .env_clear()
            .env(
                "PATH",
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            )
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log_for_stderr))
            .kill_on_drop(false);
        let mut child = command.spawn().map_err(|source| E2eError::StartProcess {
            pod: pod.clone(),
            source,
        })?;
        // The container's own process (its PID 1, seen from here), which the tests signal
        // and inspect as they would a plain process.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(pid) = self.container_pid(&runtime_root, &container_id).await {
                return Ok((child, Some(pid)));
            }
            if matches!(child.try_wait(), Ok(Some(_))) || tokio::time::Instant::now() > deadline {
                // Exited at once (the reaper records it) or never seen running.
                return Ok((child, None));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn container_pid(&self, runtime_root: &Path, container_id: &str) -> Option<u32> {
        let output = tokio::process::Command::new(&self.runtime)
            .arg("--root")
            .arg(runtime_root)
            .arg("state")
            .arg(container_id)
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
            .await
            .ok()?;
        if !output.status.success() {
            return None;
        }
        let state: serde_json::Value = serde_json::from_slice(&output.stdout).ok()?;
        let running = matches!(
            state.get("status").and_then(|status| status.as_str()),
            Some("running")
        );
        let pid = state.get("pid").and_then(|pid| pid.as_u64())?;
        (running && pid > 0).then_some(pid as u32)
    }
}

/// What `spawn` prepared for a container's start.
struct ContainerStart<'a> {
    holder: u32,
    network: &'a str,
    directory: &'a Path,
    service_account: Option<PathBuf>,
    log: (std::fs::File, std::fs::File),
    start_number: u32,
}

/// The OCI runtime's name of a container's start: unique per pod, container and start.
fn container_id(spec: &ProcessSpec, start_number: u32) -> String {
    let uid_prefix: String = spec.key.pod_uid.chars().take(8).collect();
    format!("{uid_prefix}-{}-{start_number}", spec.key.container)
}

fn cluster_holder_pid(paths: &ClusterPaths, node: &str) -> Result<u32> {
    let path = paths.node_holder_pid_file(node);
    let text = std::fs::read_to_string(&path).map_err(|source| E2eError::ReadFile {
        path: path.clone(),
        source,
    })?;
    text.trim().parse().map_err(|_| E2eError::ReadFile {
        path,
        source: std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("not a PID: {text:?}"),
        ),
    })
}
