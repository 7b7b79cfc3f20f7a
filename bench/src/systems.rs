//! The systems under test, started inside the node namespace: Switchyard's agent
//! (`standalone`, fed manifest files), the real kube-proxy 1.20 in iptables mode
//! with either iptables backend (fed by the API server), or nothing (direct pod IP).

use std::net::SocketAddrV4;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::apiserver::kubeconfig_path;
use crate::error::{Error, Result};
use crate::topology::{
    service_address, Prober, Process, NODE_ADDRESS, NODE_NAMESPACE, SERVICE_TCP_PORT,
};

static CONFIGURATION: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum System {
    Direct,
    /// The agent as installed: pods' TCP connects to Services pointed at a
    /// backend by the connect hook, everything else through the TC programs.
    Switchyard,
    /// The agent with no socket hooks: every packet of the client pod goes
    /// through the TC programs (issue 3's datapath).
    SwitchyardTc,
    KubeProxyLegacy,
    KubeProxyNft,
}

impl System {
    pub fn label(self) -> &'static str {
        match self {
            System::Direct => "direct",
            System::Switchyard => "switchyard",
            System::SwitchyardTc => "switchyard-tc-only",
            System::KubeProxyLegacy => "kube-proxy-iptables-legacy",
            System::KubeProxyNft => "kube-proxy-iptables-nft",
        }
    }

    pub fn is_kube_proxy(self) -> bool {
        matches!(self, System::KubeProxyLegacy | System::KubeProxyNft)
    }
}

/// The node's name in the API server (Node, DataplaneNode, kube-proxy's hostname).
pub const NODE_NAME: &str = "bench-node";

/// Where the programs are.
#[derive(Clone, Debug)]
pub struct Binaries {
    pub bench: PathBuf,
    pub agent: PathBuf,
    pub operator: PathBuf,
    pub kubernetes: PathBuf,
}

/// A running system; stopped on drop (the topology's teardown kills leftovers).
pub struct Running {
    pub system: System,
    pub process: Option<Process>,
    pub log: PathBuf,
    pub pin_directory: PathBuf,
    generation: usize,
    configuration: usize,
    work: PathBuf,
    binaries: Binaries,
    sync_period: String,
    /// The agent in `standalone` mode, fed this manifest file instead of the
    /// API server (Switchyard only).
    manifests: Option<PathBuf>,
}

impl Running {
    /// Starts `system` in the node namespace (both read the API server);
    /// `sync_period`: kube-proxy's periodic full resync (`--iptables-sync-period`).
    pub fn start(
        system: System,
        binaries: &Binaries,
        work: &Path,
        sync_period: &str,
    ) -> Result<Self> {
        Self::start_with(system, binaries, work, sync_period, None)
    }

    /// Starts Switchyard's agent in `standalone` mode, serving what `manifests`
    /// holds (Services, EndpointSlices and this node's DataplaneNode): a node with
    /// a Service count of its own while the API server holds another.
    pub fn start_standalone(binaries: &Binaries, work: &Path, manifests: &Path) -> Result<Self> {
        Self::start_standalone_as(System::Switchyard, binaries, work, manifests)
    }

    /// [`start_standalone`](Self::start_standalone) as `system` (`switchyard`
    /// or `switchyard-tc-only`: with or without the socket hooks).
    pub fn start_standalone_as(
        system: System,
        binaries: &Binaries,
        work: &Path,
        manifests: &Path,
    ) -> Result<Self> {
        Self::start_with(
            system,
            binaries,
            work,
            // kube-proxy's sync period: unused by the agent.
            "1h",
            Some(manifests.to_path_buf()),
        )
    }

    fn start_with(
        system: System,
        binaries: &Binaries,
        work: &Path,
        sync_period: &str,
        manifests: Option<PathBuf>,
    ) -> Result<Self> {
        let configuration = CONFIGURATION.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut running = Self {
            system,
            configuration,
            process: None,
            log: work.join(format!("{}-0.log", system.label())),
            // A fresh pin directory per configuration: nothing carries over.
            pin_directory: work.join("bpffs").join(format!(
                "switchyard-{}",
                CONFIGURATION.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            )),
            generation: 0,
            work: work.to_path_buf(),
            binaries: binaries.clone(),
            sync_period: sync_period.to_string(),
            manifests,
        };
        if system == System::KubeProxyLegacy || system == System::KubeProxyNft {
            write_iptables_wrappers(work, system)?;
        }
        running.spawn()?;
        Ok(running)
    }

    fn spawn(&mut self) -> Result<()> {
        self.log = self.work.join(format!(
            "{}-{}-{}.log",
            self.system.label(),
            self.configuration,
            self.generation
        ));
        self.generation += 1;
        let process = match self.system {
            System::Direct => None,
            System::Switchyard | System::SwitchyardTc => {
                let mut arguments: Vec<String> = match &self.manifests {
                    None => vec![
                        "run".into(),
                        "--metrics-address".into(),
                        "127.0.0.1:9964".into(),
                    ],
                    // No masquerade rule: `run` installs one only once a Service
                    // masquerades (none here), and a nat rule would turn on
                    // netfilter's connection tracking for every flow.
                    // Manifests and interfaces checked every 2 s rather than every
                    // 200 ms: each check runs `ip addr`, work `run` does only on
                    // netlink events, which would otherwise add to the latencies.
                    Some(manifests) => vec![
                        "standalone".into(),
                        "--manifests".into(),
                        manifests.display().to_string(),
                        "--no-masquerade-rule".into(),
                        "--poll-interval-ms".into(),
                        "2000".into(),
                    ],
                };
                arguments.extend([
                    "--node-name".into(),
                    NODE_NAME.into(),
                    "--pod-interfaces".into(),
                    "veth-*".into(),
                    "--host-interfaces".into(),
                    "up0".into(),
                    "--bpf-pin-dir".into(),
                    self.pin_directory.display().to_string(),
                    // 30,000 Services x 10 endpoints need 300,000 backend slots
                    // (the default is 262,144).
                    "--backends-map-size".into(),
                    "524288".into(),
                ]);
                arguments.extend(socket_hook_arguments(self.system));
                Some(Process::start(
                    "switchyard-agent",
                    Some(NODE_NAMESPACE),
                    &self.binaries.agent,
                    &arguments,
                    &[
                        ("RUST_LOG".into(), "info".into()),
                        (
                            "KUBECONFIG".into(),
                            kubeconfig_path(&self.work, "switchyard-agent", "-node")
                                .display()
                                .to_string(),
                        ),
                    ],
                    &self.log,
                )?)
            }
            System::KubeProxyLegacy | System::KubeProxyNft => {
                let wrappers = iptables_wrapper_directory(&self.work, self.system);
                let path = format!(
                    "{}:{}",
                    wrappers.display(),
                    std::env::var("PATH")
                        .unwrap_or_else(|_| "/usr/sbin:/usr/bin:/sbin:/bin".into())
                );
                Some(Process::start(
                    "kube-proxy",
                    Some(NODE_NAMESPACE),
                    &self.binaries.kubernetes.join("kube-proxy"),
                    &[
                        format!(
                            "--kubeconfig={}",
                            kubeconfig_path(&self.work, "kube-proxy", "-node").display()
                        ),
                        "--proxy-mode=iptables".into(),
                        format!("--hostname-override={NODE_NAME}"),
                        format!("--bind-address={NODE_ADDRESS}"),
                        "--cluster-cidr=10.244.0.0/16".into(),
                        // Leave the machine-wide conntrack settings alone.
                        "--conntrack-max-per-core=0".into(),
                        "--conntrack-tcp-timeout-established=0s".into(),
                        "--conntrack-tcp-timeout-close-wait=0s".into(),
                        format!("--iptables-sync-period={}", self.sync_period),
                        "--iptables-min-sync-period=1s".into(),
                        "--metrics-bind-address=127.0.0.1:10249".into(),
                        "--healthz-bind-address=127.0.0.1:10256".into(),
                        "--v=1".into(),
                    ],
                    &[("PATH".into(), path)],
                    &self.log,
                )?)
            }
        };
        self.process = process;
        Ok(())
    }

    /// Stops the process (SIGTERM) and starts a new one, as a restart does.
    /// Returns the moment the old process was signalled.
    pub fn restart(&mut self) -> Result<Instant> {
        let signalled = Instant::now();
        if let Some(mut process) = self.process.take() {
            process.stop(Duration::from_secs(10));
        }
        self.spawn()?;
        Ok(signalled)
    }

    /// Waits until every probe target answers (a TCP Service from the client pod),
    /// returning the time since the process started.
    pub fn wait_serving(
        &mut self,
        prober: &Prober,
        targets: &[SocketAddrV4],
        timeout: Duration,
    ) -> Result<Duration> {
        let since = self
            .process
            .as_ref()
            .map(|p| p.started)
            .unwrap_or_else(Instant::now);
        let mut next = 0;
        while next < targets.len() {
            if prober
                .wait_for_answer(
                    targets[next],
                    None,
                    Instant::now(),
                    Duration::from_millis(500),
                )
                .is_some()
            {
                next += 1;
                continue;
            }
            let log = self
                .process
                .as_ref()
                .map(Process::log_text)
                .unwrap_or_default();
            // The agent says when it cannot program its maps: no point waiting.
            let sync_failures: Vec<&str> = log
                .lines()
                .filter(|line| line.contains("sync failed"))
                .collect();
            let exited = self
                .process
                .as_mut()
                .is_some_and(|process| !process.is_running());
            if sync_failures.len() >= 3 || exited || since.elapsed() > timeout {
                let reason = if let Some(line) = sync_failures.last() {
                    format!("its sync keeps failing: {}", line.trim())
                } else if exited {
                    "it exited".to_string()
                } else {
                    format!("nothing within {} s", timeout.as_secs())
                };
                let tail: Vec<&str> = log.lines().rev().take(10).collect();
                return Err(Error::System(format!(
                    "failed to see {} serve {}: {reason}; last lines of its log:\n{}",
                    self.system.label(),
                    targets[next],
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                )));
            }
        }
        Ok(since.elapsed())
    }

    pub fn stop(self) {
        drop(self);
    }
}

impl Drop for Running {
    /// Stops the process, then removes its pins: the agent leaves its programs
    /// serving when it exits (as on a real node), and its socket hooks, pinned on
    /// the bench's cgroup, would otherwise go on translating the client's
    /// connects while the next system is measured.
    fn drop(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.stop(Duration::from_secs(10));
        }
        if self.pin_directory.exists() {
            if let Err(error) = std::fs::remove_dir_all(&self.pin_directory) {
                eprintln!(
                    "bench: failed to remove {}: {error}",
                    self.pin_directory.display()
                );
            }
        }
    }
}

/// The environment variable that names the bench's own cgroup (set by the outer
/// process, which creates it and removes it at the end).
pub const BENCH_CGROUP: &str = "SWITCHYARD_BENCH_CGROUP";

/// The bench's cgroup as the agent can see it: `ip netns exec` mounts a fresh
/// sysfs, which hides `/sys/fs/cgroup`, so the isolated bench mounts cgroup v2
/// in its work directory as well and sets this once.
pub static AGENT_CGROUP: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// Where the agent's socket hooks go: the bench's own cgroup, which holds the
/// bench and every process it starts (the client pod among them) and nothing
/// else on the machine. Without one, no hooks (the TC programs carry everything).
fn socket_hook_arguments(system: System) -> Vec<String> {
    match (system, AGENT_CGROUP.get()) {
        (System::Switchyard, Some(cgroup)) => vec![
            "--cgroup".into(),
            cgroup.display().to_string(),
            "--pod-connect-time-load-balancing".into(),
            "tcp".into(),
        ],
        _ => vec!["--no-socket-hooks".into()],
    }
}

/// Probe targets: the first and last TCP Services of `count`.
pub fn probe_targets(count: u32) -> Vec<SocketAddrV4> {
    let last_tcp = if count.is_multiple_of(2) {
        count.saturating_sub(2)
    } else {
        count - 1
    };
    let mut targets = vec![SocketAddrV4::new(service_address(0), SERVICE_TCP_PORT)];
    if last_tcp > 0 {
        targets.push(SocketAddrV4::new(
            service_address(last_tcp),
            SERVICE_TCP_PORT,
        ));
    }
    targets
}

fn iptables_wrapper_directory(work: &Path, system: System) -> PathBuf {
    work.join(format!("iptables-{}", system.label()))
}

/// kube-proxy 1.20 runs whatever `iptables` is first on its PATH (the official
/// image picks a backend with a wrapper script): these wrappers pick one.
fn write_iptables_wrappers(work: &Path, system: System) -> Result<()> {
    let backend = if system == System::KubeProxyNft {
        "nft"
    } else {
        "legacy"
    };
    let directory = iptables_wrapper_directory(work, system);
    std::fs::create_dir_all(&directory).map_err(|error| Error::Output {
        path: directory.display().to_string(),
        detail: error.to_string(),
    })?;
    for family in ["iptables", "ip6tables"] {
        for suffix in ["", "-save", "-restore"] {
            let name = format!("{family}{suffix}");
            let path = directory.join(&name);
            let script = format!("#!/bin/sh\nexec /usr/sbin/{family}-{backend}{suffix} \"$@\"\n");
            std::fs::write(&path, script)
                .and_then(|()| {
                    use std::os::unix::fs::PermissionsExt as _;
                    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
                })
                .map_err(|error| Error::Output {
                    path: path.display().to_string(),
                    detail: error.to_string(),
                })?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_targets_are_the_first_and_last_tcp_services() {
        assert_eq!(probe_targets(100).len(), 2);
        assert_eq!(probe_targets(100)[1].ip(), &service_address(98));
        assert_eq!(probe_targets(1).len(), 1);
    }
}
