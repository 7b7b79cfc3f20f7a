//! One cluster for every scenario, in a fixed order, each reported by a test of its own.
//!
//! The scenarios move one cluster from state to state (each starts where the one before it
//! left: installed and on eBPF after (1), back on kube-proxy after (3), ...), and starting a
//! cluster for each would take longer than the scenarios. So every test asks [`run_scenario`] for its
//! scenario: the scenarios before it that have not run yet run first, in order, each exactly
//! once (whichever test asks first), and the test reports its own scenario's outcome. A test
//! filter therefore still runs what its scenario needs, and the order libtest picks does not
//! matter.
//!
//! A scenario that fails does not stop the ones after it: its panic is caught and kept as its
//! outcome, and the next scenario first brings the cluster back to the state it starts from
//! ([`recover`]); if even that fails, that scenario fails saying so. In a green run nothing is
//! recovered.
//!
//! The World (its echo servers, kube clients and recorders are tasks) lives on one runtime
//! shared by the tests: a runtime per test would end those tasks with the test.

use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use futures::FutureExt;
use k8s_openapi::api::apps::v1::DaemonSet;
use kube::api::{ListParams, Patch, PatchParams};
use switchyard_crds::DataplaneMode;

use crate::migration_support::*;

/// The scenarios, in the order they run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Scenario {
    /// (1) helm install, then KubeProxy -> Ebpf under traffic.
    HelmInstallToEbpf,
    /// (7) `kubectl wait` and the columns, during and after (1).
    KubectlWait,
    /// (2) the agents upgraded by `helm upgrade`, one node at a time.
    AgentUpgrade,
    /// (3) Ebpf -> KubeProxy with live connections draining.
    Rollback,
    /// (4) KubeProxy -> Ebpf with the operator SIGKILLed twice; the nodeSelector reset; back.
    OperatorKilled,
    /// (4b) an operator that may not patch kube-proxy.
    NotPatchable,
    /// (6) kube-proxy owned by Argo CD.
    ArgoCd,
    /// (5) an agent that never becomes Ready.
    NeverReady,
    /// (5, continued) the DataplaneConfig deleted while a transition is held.
    ConfigDeleted,
    /// Without a DataplaneConfig, cleanup withdrawn where kube-proxy runs.
    CleanupWithdrawn,
    /// Both transitions with the `kubernetes` Service's endpoint dead.
    KubernetesServiceDead,
    /// kube-proxy parity before, mixed and after a switch the SCTP preflight first refused.
    KubeProxyParity,
}

impl Scenario {
    pub const ORDER: [Scenario; 12] = [
        Scenario::HelmInstallToEbpf,
        Scenario::KubectlWait,
        Scenario::AgentUpgrade,
        Scenario::Rollback,
        Scenario::OperatorKilled,
        Scenario::NotPatchable,
        Scenario::ArgoCd,
        Scenario::NeverReady,
        Scenario::ConfigDeleted,
        Scenario::CleanupWithdrawn,
        Scenario::KubernetesServiceDead,
        Scenario::KubeProxyParity,
    ];

    pub fn title(self) -> &'static str {
        match self {
            Scenario::HelmInstallToEbpf => "(1) helm install and KubeProxy -> Ebpf",
            Scenario::KubectlWait => "(7) kubectl wait and the columns",
            Scenario::AgentUpgrade => "(2) agent upgrade by helm upgrade",
            Scenario::Rollback => "(3) rollback to KubeProxy with draining",
            Scenario::OperatorKilled => "(4) the operator killed twice",
            Scenario::NotPatchable => "(4b) an operator that may not patch kube-proxy",
            Scenario::ArgoCd => "(6) kube-proxy owned by Argo CD",
            Scenario::NeverReady => "(5) an agent never Ready",
            Scenario::ConfigDeleted => "(5) the DataplaneConfig deleted mid-transition",
            Scenario::CleanupWithdrawn => "without a DataplaneConfig, cleanup withdrawn",
            Scenario::KubernetesServiceDead => {
                "there and back with the kubernetes Service's endpoint dead"
            }
            Scenario::KubeProxyParity => {
                "kube-proxy parity before, mixed and after a switch the SCTP preflight refused"
            }
        }
    }

    /// The mode the cluster must be Ready in when the scenario starts (what the scenario
    /// before it leaves), or `None`: (1) installs the chart itself, (7) only reads what (1)
    /// saw.
    fn starts_from(self) -> Option<DataplaneMode> {
        match self {
            Scenario::HelmInstallToEbpf | Scenario::KubectlWait => None,
            Scenario::AgentUpgrade | Scenario::Rollback => Some(DataplaneMode::Ebpf),
            Scenario::OperatorKilled
            | Scenario::NotPatchable
            | Scenario::ArgoCd
            | Scenario::NeverReady
            | Scenario::ConfigDeleted
            | Scenario::CleanupWithdrawn
            | Scenario::KubernetesServiceDead
            | Scenario::KubeProxyParity => Some(DataplaneMode::KubeProxy),
        }
    }

    async fn play(self, world: &World, shared: &mut Shared) {
        match self {
            Scenario::HelmInstallToEbpf => super::to_ebpf::play(world, shared).await,
            Scenario::KubectlWait => super::to_ebpf::check_kubectl_wait(shared),
            Scenario::AgentUpgrade => super::upgrade::play(world).await,
            Scenario::Rollback => super::rollback::play(world).await,
            Scenario::OperatorKilled => super::operator_killed::play(world).await,
            Scenario::NotPatchable => super::not_patchable::play(world).await,
            Scenario::ArgoCd => super::argo_cd::play(world).await,
            Scenario::NeverReady => super::never_ready::play(world).await,
            Scenario::ConfigDeleted => super::never_ready::play_config_deleted(world).await,
            Scenario::CleanupWithdrawn => super::never_ready::play_cleanup_withdrawn(world).await,
            Scenario::KubernetesServiceDead => super::kubernetes_service::play(world).await,
            Scenario::KubeProxyParity => super::parity::play(world).await,
        }
    }
}

/// What one scenario hands to a later one's test.
#[derive(Default)]
pub struct Shared {
    /// What `kubectl wait` and `kubectl get` showed during (1), checked by (7).
    pub kubectl: Option<super::to_ebpf::KubectlEvidence>,
}

/// Runs `which` (and the scenarios before it that have not run yet) on the shared cluster,
/// and fails the calling test if `which` failed.
pub fn run_scenario(which: Scenario) {
    let outcome = runtime().block_on(async {
        let mut suite = suite().lock().await;
        suite.run_until(which).await
    });
    if let Err(message) = outcome {
        panic!("{} failed: {message}", which.title());
    }
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a tokio runtime for the migration scenarios")
    })
}

fn suite() -> &'static tokio::sync::Mutex<Suite> {
    static SUITE: OnceLock<tokio::sync::Mutex<Suite>> = OnceLock::new();
    SUITE.get_or_init(|| tokio::sync::Mutex::new(Suite::default()))
}

#[derive(Default)]
struct Suite {
    /// Made once, by the first scenario; a World that could not be made fails every scenario.
    world: Option<Result<Arc<World>, String>>,
    shared: Shared,
    outcomes: BTreeMap<Scenario, Result<(), String>>,
    /// The scenario that failed since the cluster was last in a known state.
    failed: Option<Scenario>,
    /// Kept for the whole run (dropped with the process).
    _capture: Option<super::checks::ClientCapture>,
}

impl Suite {
    async fn run_until(&mut self, which: Scenario) -> Result<(), String> {
        for scenario in Scenario::ORDER {
            if !self.outcomes.contains_key(&scenario) {
                let outcome = self.attempt(scenario).await;
                self.outcomes.insert(scenario, outcome);
            }
            if scenario == which {
                break;
            }
        }
        if self.outcomes.len() == Scenario::ORDER.len() {
            // Every scenario has run: the World's namespaces, servers and capture go now, as a
            // test's locals would (a static is never dropped).
            self._capture = None;
            self.world = Some(Err("every scenario has run".into()));
        }
        self.outcomes
            .get(&which)
            .cloned()
            .unwrap_or_else(|| Err("never ran".into()))
    }

    async fn world(&mut self) -> Result<Arc<World>, String> {
        if self.world.is_none() {
            let made = World::new().await.map(Arc::new).map_err(|error| {
                format!("failed to serve the demo Service by kube-proxy: {error}")
            });
            if let Ok(world) = &made {
                self._capture = Some(super::checks::ClientCapture::start(world));
            }
            self.world = Some(made);
        }
        self.world.clone().unwrap_or_else(|| Err("no world".into()))
    }

    async fn attempt(&mut self, scenario: Scenario) -> Result<(), String> {
        let world = self.world().await?;
        if let (Some(failed), Some(mode)) = (self.failed, scenario.starts_from()) {
            println!(
                "\n=== bringing the cluster back to {mode} for {} after {} failed",
                scenario.title(),
                failed.title()
            );
            recover(&world, mode).await.map_err(|error| {
                format!(
                    "failed to bring the cluster back to {mode} after {} failed: {error}",
                    failed.title()
                )
            })?;
            self.failed = None;
        }
        println!("\n=== {}", scenario.title());
        let started = Instant::now();
        let outcome = AssertUnwindSafe(scenario.play(&world, &mut self.shared))
            .catch_unwind()
            .await
            .map_err(|panic| panic_message(panic.as_ref()));
        println!(
            "=== {}: {} after {:.1?}",
            scenario.title(),
            if outcome.is_ok() { "passed" } else { "FAILED" },
            started.elapsed()
        );
        if outcome.is_err() && scenario.starts_from().is_some() {
            self.failed = Some(scenario);
        }
        outcome
    }
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(message) = payload.downcast_ref::<&str>() {
        message.to_string()
    } else if let Some(message) = payload.downcast_ref::<String>() {
        message.clone()
    } else {
        "panicked".into()
    }
}

/// Undoes what a failed scenario may have left (a hidden pin directory, a held kube-proxy pod,
/// Argo CD's mark, a deleted DaemonSet or RoleBinding, a killed operator), then asks for `mode`
/// and waits until the cluster is Ready in it. Runs after a failure, and at the start of the
/// scenario after (5), which leaves node-3's agent unable to pin and no DataplaneConfig on
/// purpose.
pub(super) async fn recover(world: &World, mode: DataplaneMode) -> Outcome<()> {
    // (5) hides node-3's pin directory under a tmpfs. Unmounting fails when nothing is mounted
    // there, which is the usual case: only a successful unmount needs node-3's agent restarted.
    let unmounted = switchyard_e2e::netns::run_in_node(
        &world.paths,
        "node-3",
        "umount",
        &["/sys/fs/bpf/switchyard"],
    )
    .is_ok();
    if unmounted {
        run(
            "kubectl",
            &[
                "-n",
                RELEASE_NAMESPACE,
                "delete",
                "pod",
                "-l",
                "app.kubernetes.io/component=agent",
                "--field-selector",
                "spec.nodeName=node-3",
                "--wait=false",
            ],
        )?;
    }
    // (4) holds node-3's kube-proxy pod with a finalizer.
    let pods = world
        .kube_proxy_pods()
        .list(&ListParams::default().labels("k8s-app=kube-proxy"))
        .await?;
    for pod in pods.items {
        let held = pod
            .metadata
            .finalizers
            .iter()
            .flatten()
            .any(|finalizer| finalizer == HOLD_FINALIZER);
        if let (true, Some(name)) = (held, pod.metadata.name.as_deref()) {
            world.hold_pod(name, false).await?;
        }
    }
    // (6) marks kube-proxy as Argo CD's, and deletes it.
    match world.kube_proxy_daemon_set().get_opt("kube-proxy").await? {
        Some(_) => {
            let unmark = serde_json::json!({"metadata": {"annotations": {"argocd.argoproj.io/tracking-id": null}}});
            world
                .kube_proxy_daemon_set()
                .patch(
                    "kube-proxy",
                    &PatchParams::default(),
                    &Patch::Merge(&unmark),
                )
                .await?;
        }
        None => {
            switchyard_e2e::objects::create_kube_proxy_daemonset(&world.client).await?;
        }
    }
    // (4b) deletes the chart's RoleBinding: helm puts back what its release lacks; the values
    // are reused so the agent tag of (2) stays.
    world.helm_install(&["--reuse-values"])?;
    world
        .wait_agents_reporting(Duration::from_secs(120))
        .await?;
    world
        .wait_operator_leading(None, Duration::from_secs(60))
        .await?;
    // Management Managed again (the apply owns the field (6) set to External).
    world
        .apply_config(
            mode,
            serde_json::json!({"maxUnavailable": 3, "nodeReadyTimeoutSeconds": 60, "drainTimeoutSeconds": 120}),
        )
        .await?;
    let started = Instant::now();
    loop {
        let config = world.config().await?;
        let daemon_set: Option<DaemonSet> =
            world.kube_proxy_daemon_set().get_opt("kube-proxy").await?;
        let kube_proxy_as_expected = daemon_set.as_ref().is_some_and(|daemon_set| {
            kube_proxy_disabled(daemon_set) == (mode == DataplaneMode::Ebpf)
        });
        if config
            .as_ref()
            .is_some_and(|config| config_ready(config, mode))
            && kube_proxy_as_expected
        {
            break;
        }
        if started.elapsed() > Duration::from_secs(180) {
            return Err(format!(
                "failed to see the DataplaneConfig Ready on {mode} within 180 s: {:#?}",
                config.and_then(|config| config.status)
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    if mode == DataplaneMode::KubeProxy {
        for node in NODES {
            let started = Instant::now();
            while !world.kube_proxy_rules(node)?.demo_service {
                if started.elapsed() > Duration::from_secs(60) {
                    return Err(
                        format!("failed to see kube-proxy's rules on {node} within 60 s").into(),
                    );
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    Ok(())
}
