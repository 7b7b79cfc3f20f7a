//! kube-proxy parity through a switch (issue 24's e2e): what kube-proxy served keeps working
//! before the switch, while the cluster is mixed and after it, with clients entering through
//! every node ([`super::parity_services`] has the Services and clients): a LoadBalancer with
//! source ranges, 4,000-byte UDP datagrams, a Local NodePort with a remote endpoint, and the
//! preflight refusing the switch while an SCTP Service exists.
//!
//! 1. The parity Services and their clients; kube-proxy programs them on every node. Traffic
//!    runs from here to the end: flows that must be answered (not one may fail) and flows that
//!    must never be.
//! 2. An SCTP Service is created (the operator's `ServicesSupported` condition names it first,
//!    so the refusal cannot be a race), then `mode: Ebpf` (node-1 and node-2 as canaries, then
//!    node-3): the preflight refuses (`Degraded`, reason `UnsupportedServices`, naming the
//!    Service; a Warning Event). Phase "all on kube-proxy" is observed while it is refused; a
//!    recorder of every DataplaneNode version shows no node was told `Ebpf` meanwhile.
//! 3. The SCTP Service is deleted: the transition goes ahead by itself (the control). As soon
//!    as a watch shows node-2 told `Ebpf` (with node-1), the transition is paused: node-1 and
//!    node-2 serve from eBPF, node-3 stays on kube-proxy (kube-proxy still runs everywhere: it
//!    is disabled only once every node serves). Phase "mixed" is observed there.
//! 4. Unpaused, the transition completes (kube-proxy disabled, its rules cleaned): phase "all on
//!    eBPF".
//!
//! Each phase must show every flow enough times (answers from every expected backend; settled
//! dropped attempts); a violation names its item. Violations are gathered and reported together
//! at the end, per item, so one broken item does not hide another.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::runtime::watcher;
use kube::Api;
use switchyard_crds::{
    condition_types, find_condition, reasons, ConditionStatus, DataplaneConfig, DataplaneMode,
    DataplaneNode, DataplanePhase,
};
use switchyard_e2e::traffic::TrafficReport;
use switchyard_e2e::wait::{wait_for, Check, WaitOptions};

use super::checks::*;
use super::parity_services::*;
use crate::migration_support::*;

/// The rollout of this scenario: node-1 and node-2 are the canaries, told together; node-3 is
/// told only once their soak is judged, so pausing as soon as node-2 is told holds the cluster
/// mixed, whatever the machine's speed. A soak of 0 (the first window of disruption signals
/// after the switch decides) keeps the scenario short; the signals this scenario causes on
/// purpose (source-range drops, drops of a Local Service whose endpoints are elsewhere) are not
/// budgeted (docs/canary.md).
fn rollout() -> serde_json::Value {
    serde_json::json!({
        "maxUnavailable": 2,
        "nodeReadyTimeoutSeconds": 60,
        "drainTimeoutSeconds": 20,
        "canary": {"count": 2, "soakSeconds": 0, "batchSoakSeconds": 0},
    })
}

/// The node whose instruction to go to eBPF pauses the transition (told with node-1, in one
/// batch; node-3 comes after the canaries' soak).
const PAUSE_AT: &str = "node-2";

/// The scenario: see the module's documentation.
pub async fn play(world: &World) {
    let scenario_started = Instant::now();
    let parity = ParityWorld::new(world)
        .await
        .expect("the parity Services programmed by kube-proxy on every node");
    println!(
        "parity Services programmed by kube-proxy on every node after {:.1?}",
        scenario_started.elapsed()
    );
    let (served, dropped) = parity.start_traffic();
    let mut violations: Vec<(Item, String)> = Vec::new();
    let mut phase_reports = Vec::new();

    // 2. The SCTP Service holds the switch back.
    let refusal_events_before = world
        .event_count(
            "default",
            "DataplaneConfig",
            "default",
            reasons::UNSUPPORTED_SERVICES,
        )
        .await
        .expect("Events");
    create_sctp_service(world).await.expect("the SCTP Service");
    let sctp_named = format!("default/{SCTP_SERVICE} (SCTP ports)");
    wait_condition(
        world,
        "see ServicesSupported False naming the SCTP Service on kube-proxy",
        |config| {
            condition_of(config, condition_types::SERVICES_SUPPORTED).is_some_and(
                |(status, message)| {
                    status == ConditionStatus::False && message.contains(&sctp_named)
                },
            )
        },
    )
    .await
    .expect("the operator seeing the SCTP Service");
    let dataplane_nodes = Recorder::start_listed(Api::<DataplaneNode>::all(world.client.clone()))
        .await
        .expect("record DataplaneNodes");
    let refused_at = Instant::now();
    world
        .apply_config(DataplaneMode::Ebpf, rollout())
        .await
        .expect("apply mode Ebpf");
    let refusal = wait_condition(world, "see the transition refused in Preflight", |config| {
        let preflight = config
            .status
            .as_ref()
            .is_some_and(|status| status.phase == DataplanePhase::Preflight);
        let current = config
            .status
            .as_ref()
            .is_some_and(|status| status.observed_generation == config.metadata.generation);
        let degraded = find_condition(
            &config
                .status
                .as_ref()
                .map(|status| status.conditions.clone())
                .unwrap_or_default(),
            condition_types::DEGRADED,
        )
        .is_some_and(|condition| {
            condition.status == ConditionStatus::True
                && condition.reason == reasons::UNSUPPORTED_SERVICES
                && condition.message.contains(&sctp_named)
        });
        preflight && current && degraded
    })
    .await;
    match &refusal {
        Ok(message) => println!(
            "refused {:.1?} after mode Ebpf: {message}",
            refused_at.elapsed()
        ),
        Err(error) => violations.push((Item::SctpPreflight, error.clone())),
    }
    let refusal_events = world
        .event_count_above(
            "default",
            "DataplaneConfig",
            "default",
            reasons::UNSUPPORTED_SERVICES,
            refusal_events_before,
        )
        .await
        .expect("Events");
    if refusal_events <= refusal_events_before {
        violations.push((
            Item::SctpPreflight,
            "no UnsupportedServices Event about the DataplaneConfig".into(),
        ));
    }

    let all_kube_proxy = Phase::new("all on kube-proxy, the switch refused", &[]);
    let start = PhaseStart::now(&served, &dropped);
    let outcome = observe_phase(&parity, &all_kube_proxy, &start, &served, &dropped).await;
    violations.extend(outcome.violations);
    phase_reports.push((all_kube_proxy.name, outcome.lines));
    // Nothing moved while refused: no DataplaneNode version told Ebpf, kube-proxy not disabled.
    dataplane_nodes
        .wait_caught_up(&Api::all(world.client.clone()))
        .await
        .expect("DataplaneNodes recorded");
    let told: Vec<String> = dataplane_nodes
        .versions()
        .iter()
        .filter(|version| version.object.spec.mode == DataplaneMode::Ebpf)
        .filter_map(|version| version.object.metadata.name.clone())
        .collect();
    if !told.is_empty() {
        violations.push((
            Item::SctpPreflight,
            format!("nodes told Ebpf while the SCTP Service existed: {told:?}"),
        ));
    }
    let daemon_set = world
        .kube_proxy_daemon_set()
        .get("kube-proxy")
        .await
        .expect("the kube-proxy DaemonSet");
    if kube_proxy_disabled(&daemon_set) {
        violations.push((
            Item::SctpPreflight,
            "kube-proxy disabled while the SCTP Service existed".into(),
        ));
    }

    // 3. Deleting it lets the switch go ahead; held with node-1 and node-2 on eBPF.
    let mut nodes_watch = watcher(
        Api::<DataplaneNode>::all(world.client.clone()),
        watcher::Config::default(),
    )
    .boxed();
    while let Some(event) = nodes_watch.next().await {
        if matches!(event, Ok(watcher::Event::InitDone)) {
            break;
        }
    }
    let deleted_at = Instant::now();
    services(world)
        .delete(SCTP_SERVICE, &DeleteParams::default())
        .await
        .expect("delete the SCTP Service");
    let paused = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(event) = nodes_watch.next().await {
            if let Ok(watcher::Event::Apply(node)) = event {
                if node.metadata.name.as_deref() == Some(PAUSE_AT)
                    && node.spec.mode == DataplaneMode::Ebpf
                {
                    return set_paused(world, true)
                        .await
                        .map_err(|error| error.to_string());
                }
            }
        }
        Err("the DataplaneNode watch ended".to_string())
    })
    .await;
    drop(nodes_watch);
    match paused {
        Ok(Ok(())) => println!(
            "{PAUSE_AT} told Ebpf {:.1?} after the SCTP Service was deleted: paused",
            deleted_at.elapsed()
        ),
        Ok(Err(error)) => panic!("failed to pause the transition: {error}"),
        Err(_) => panic!(
            "failed to see {PAUSE_AT} told Ebpf within 60 s of the SCTP Service's deletion: {}",
            violations_text(&violations)
        ),
    }
    // Whatever happens next, the transition is unpaused before anything is asserted.
    let mixed = observe_mixed(world, &parity, &served, &dropped).await;
    set_paused(world, false).await.expect("unpause");
    let (mixed_lines, mixed_violations) = mixed.unwrap_or_else(|error| panic!("{error}"));
    violations.extend(mixed_violations);
    phase_reports.push((
        "mixed: node-1 and node-2 on eBPF, node-3 on kube-proxy",
        mixed_lines,
    ));

    // 4. The rest of the switch.
    let to_ebpf = wait_config_ready(
        world,
        DataplaneMode::Ebpf,
        &served,
        Duration::from_secs(150),
    )
    .await;
    println!(
        "Ready on Ebpf {:.1} s after unpausing",
        to_ebpf.as_secs_f64()
    );
    for node in NODES {
        let rules = world.kube_proxy_rules(node).expect("iptables-save");
        assert_eq!(
            rules.service_chains, 0,
            "kube-proxy's rules left on {node}: {rules:?}"
        );
    }
    let all_ebpf = Phase::new("all on eBPF, kube-proxy gone", &NODES);
    let start = PhaseStart::now(&served, &dropped);
    let outcome = observe_phase(&parity, &all_ebpf, &start, &served, &dropped).await;
    violations.extend(outcome.violations);
    phase_reports.push((all_ebpf.name, outcome.lines));

    let served_report = served.stop().await;
    let dropped_report = dropped.stop().await;
    for (phase, lines) in &phase_reports {
        println!("phase {phase}:");
        for line in lines {
            println!("  {line}");
        }
    }
    println!("whole scenario, flows that must be answered: {served_report}");
    println!("whole scenario, flows that must never be answered: {dropped_report}");
    violations.extend(whole_run_violations(
        &parity,
        &served_report,
        &dropped_report,
    ));
    parity
        .remove(world)
        .await
        .expect("remove the parity Services");
    assert!(
        violations.is_empty(),
        "kube-proxy parity broken:\n{}",
        violations_text(&violations)
    );
    println!(
        "kube-proxy parity held before, mixed and after: {} connections answered, 0 failed; {} attempts never answered, as kube-proxy leaves them; scenario {:.1?}",
        served_report.flows.values().map(|flow| flow.successes).sum::<u64>(),
        dropped_report.attempts(),
        scenario_started.elapsed()
    );
}

/// Over the whole run (the transitions' moments included): not one served flow failed, and
/// not one dropped flow was answered.
fn whole_run_violations(
    parity: &ParityWorld,
    served: &TrafficReport,
    dropped: &TrafficReport,
) -> Vec<(Item, String)> {
    let mut violations = Vec::new();
    for probe in parity.probes() {
        let name = &probe.flow.name;
        match probe.expectation {
            Expectation::Served { .. } => {
                let flow = served.flows.get(name).cloned().unwrap_or_default();
                if !flow.failures.is_empty() || flow.successes == 0 {
                    violations.push((
                        probe.item,
                        format!(
                            "{name}: {} answered, {} failed over the whole scenario",
                            flow.successes,
                            flow.failures.len()
                        ),
                    ));
                }
            }
            Expectation::Dropped { .. } => {
                let flow = dropped.flows.get(name).cloned().unwrap_or_default();
                if flow.successes > 0 || flow.attempts == 0 {
                    violations.push((
                        probe.item,
                        format!(
                            "{name}: answered {} of {} attempts over the whole scenario ({:?})",
                            flow.successes, flow.attempts, flow.backends
                        ),
                    ));
                }
            }
        }
    }
    violations
}

/// Waits for the mixed cluster the pause holds (node-1 and node-2 serving from eBPF, node-3
/// never told, kube-proxy running everywhere) and observes it. An error means the mixed
/// cluster never came (the pause came too late, or a node did not serve).
async fn observe_mixed(
    world: &World,
    parity: &ParityWorld,
    served: &switchyard_e2e::traffic::TrafficGenerator,
    dropped: &switchyard_e2e::traffic::TrafficGenerator,
) -> Result<(Vec<String>, Vec<(Item, String)>), String> {
    wait_for(
        "see node-1 and node-2 serving from eBPF and node-3 left on kube-proxy",
        WaitOptions::new(Duration::from_secs(60)).every(Duration::from_millis(200)),
        || async {
            let nodes = world.dataplane_nodes().await?;
            let state = |name: &str| nodes.get(name);
            let serving = |name: &str| state(name).is_some_and(is_serving);
            let node_3_untold =
                state("node-3").is_some_and(|node| node.spec.mode == DataplaneMode::KubeProxy);
            Ok::<_, Failure>(if !node_3_untold {
                Check::Failed(format!(
                    "node-3 was told Ebpf before the pause held: {}",
                    progress_line(None, &nodes, DataplaneMode::Ebpf)
                ))
            } else if serving("node-1") && serving("node-2") {
                Check::Ready(())
            } else {
                Check::NotYet(progress_line(None, &nodes, DataplaneMode::Ebpf))
            })
        },
    )
    .await
    .map_err(|error| error.to_string())?;
    // kube-proxy still serves every node (node-3 by itself).
    for node in NODES {
        let rules = world
            .kube_proxy_rules(node)
            .map_err(|error| error.to_string())?;
        if !rules.demo_service {
            return Err(format!(
                "kube-proxy's rules gone from {node} while the cluster is mixed: {rules:?}"
            ));
        }
    }
    let phase = Phase::new("mixed", &["node-1", "node-2"]);
    let start = PhaseStart::now(served, dropped);
    let outcome = observe_phase(parity, &phase, &start, served, dropped).await;
    // The pause held all through: node-3 still untold.
    let nodes = world
        .dataplane_nodes()
        .await
        .map_err(|error| error.to_string())?;
    if nodes
        .get("node-3")
        .is_none_or(|node| node.spec.mode != DataplaneMode::KubeProxy)
    {
        return Err(format!(
            "node-3 was told Ebpf while paused: {}",
            progress_line(None, &nodes, DataplaneMode::Ebpf)
        ));
    }
    Ok((outcome.lines, outcome.violations))
}

/// Sets `spec.paused` by a merge patch (a field of its own, which the scenarios' Server-Side
/// Applies of the DataplaneConfig neither own nor reset).
async fn set_paused(world: &World, paused: bool) -> Outcome<()> {
    Api::<DataplaneConfig>::all(world.client.clone())
        .patch(
            "default",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"paused": paused}})),
        )
        .await?;
    Ok(())
}

/// A condition's status and message.
fn condition_of(config: &DataplaneConfig, type_: &str) -> Option<(ConditionStatus, String)> {
    let status = config.status.as_ref()?;
    find_condition(&status.conditions, type_)
        .map(|condition| (condition.status, condition.message.clone()))
}

/// Waits (30 s) until the DataplaneConfig satisfies `holds`; its Degraded message, or the
/// failure with the last status seen.
async fn wait_condition(
    world: &World,
    description: &str,
    holds: impl Fn(&DataplaneConfig) -> bool,
) -> Result<String, String> {
    wait_for(
        description,
        WaitOptions::new(Duration::from_secs(30)).every(Duration::from_millis(200)),
        || async {
            let config = world.config().await?;
            Ok::<_, Failure>(match config {
                Some(config) if holds(&config) => Check::Ready(
                    condition_of(&config, condition_types::DEGRADED)
                        .map(|(_, message)| message)
                        .unwrap_or_default(),
                ),
                other => Check::NotYet(format!("{:?}", other.and_then(|config| config.status))),
            })
        },
    )
    .await
    .map_err(|error| error.to_string())
}

fn violations_text(violations: &[(Item, String)]) -> String {
    let mut by_item: BTreeMap<Item, Vec<&String>> = BTreeMap::new();
    for (item, violation) in violations {
        by_item.entry(*item).or_default().push(violation);
    }
    by_item
        .iter()
        .map(|(item, list)| {
            let lines: Vec<String> = list.iter().map(|line| format!("  - {line}")).collect();
            format!("{item}:\n{}", lines.join("\n"))
        })
        .collect::<Vec<_>>()
        .join("\n")
}
