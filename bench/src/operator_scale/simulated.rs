//! The simulated agents: a process that answers each DataplaneNode spec change
//! as a real agent's status would, after a random delay.

use std::collections::HashMap;
use std::io::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt as _;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::watcher;
use kube::ResourceExt as _;
use serde_json::json;
use switchyard_crds::{
    condition_types, reasons, set_condition, Condition, ConditionStatus, DataplaneMode,
    DataplaneNode, DataplaneNodeStatus,
};

use crate::error::{Error, Result};
use crate::load::{unix_micros, Picker};

/// What an agent reports about `node`'s spec (no kube-proxy pods run anywhere:
/// its rules are present until the agent is told to clean them).
pub fn simulated_status(
    node: &DataplaneNode,
    now: chrono::DateTime<chrono::Utc>,
) -> DataplaneNodeStatus {
    let generation = node.metadata.generation;
    let mut status = node.status.clone().unwrap_or_default();
    let ebpf = node.spec.mode == DataplaneMode::Ebpf;
    let rules_present = !node.spec.iptables_cleanup;
    let condition = |type_: &str, holds: bool, reason: &str| {
        Condition::new(
            type_,
            ConditionStatus::from_bool(holds),
            reason,
            "simulated agent",
            generation,
            now,
        )
    };
    for new in [
        condition(
            condition_types::HOST_METADATA_READY,
            true,
            reasons::HOST_METADATA_RECEIVED,
        ),
        condition(
            condition_types::PROGRAMS_ATTACHED,
            ebpf,
            if ebpf {
                reasons::ATTACHED
            } else {
                reasons::DETACHED
            },
        ),
        condition(condition_types::SERVICES_SYNCED, true, reasons::SYNCED),
        condition(
            condition_types::KUBE_PROXY_RULES_PRESENT,
            rules_present,
            if rules_present {
                reasons::RULES_PRESENT
            } else {
                reasons::RULES_ABSENT
            },
        ),
        condition(
            condition_types::KUBE_PROXY_HEALTHY,
            rules_present && !ebpf,
            if rules_present && !ebpf {
                reasons::KUBE_PROXY_HEALTHZ_OK
            } else {
                reasons::KUBE_PROXY_UNHEALTHY
            },
        ),
        condition(
            condition_types::CHAIN_ORDER_SAFE,
            true,
            reasons::CHAIN_ORDER_VERIFIED,
        ),
        condition(condition_types::READY, true, reasons::AGENT_READY),
    ] {
        set_condition(&mut status.conditions, new);
    }
    status.observed_generation = generation;
    status.agent_version = Some("simulated".into());
    status
}

/// `switchyard-bench simulated-agents`: watches every DataplaneNode and answers
/// each new generation after a random 50-500 ms, as its agent would. Each answer
/// is appended to `$SWITCHYARD_BENCH_ANSWERS` as `{"seen_us","answered_us"}`.
pub async fn simulated_agents(seed: u64) -> Result<()> {
    let client = kube::Client::try_default().await.map_err(|error| {
        Error::ApiServer(format!("failed to build a client from KUBECONFIG: {error}"))
    })?;
    let answers_path = std::env::var_os("SWITCHYARD_BENCH_ANSWERS")
        .ok_or_else(|| Error::System("failed to find SWITCHYARD_BENCH_ANSWERS".into()))?;
    let answers = Arc::new(Mutex::new(
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&answers_path)
            .map_err(|error| Error::System(format!("failed to open the answers file: {error}")))?,
    ));
    let api: Api<DataplaneNode> = Api::all(client);
    // name -> the generation already being answered.
    let mut answering: HashMap<String, i64> = HashMap::new();
    let mut picker = Picker::new(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let mut events = watcher(api.clone(), watcher::Config::default()).boxed();
    while let Some(event) = events.next().await {
        let nodes = match event {
            Ok(watcher::Event::Apply(node)) | Ok(watcher::Event::InitApply(node)) => vec![node],
            Ok(_) => continue,
            Err(error) => {
                eprintln!("simulated agents: watch error: {error}");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        for node in nodes {
            let Some(generation) = node.metadata.generation else {
                continue;
            };
            let observed = node
                .status
                .as_ref()
                .and_then(|status| status.observed_generation);
            let name = node.name_any();
            if observed == Some(generation) || answering.get(&name) == Some(&generation) {
                continue;
            }
            answering.insert(name.clone(), generation);
            let delay = Duration::from_millis(50 + picker.below(451) as u64);
            let seen_us = unix_micros();
            let (api, answers) = (api.clone(), answers.clone());
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                let status = simulated_status(&node, chrono::Utc::now());
                let patch = json!({"status": status});
                for attempt in 0..5u64 {
                    match api
                        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                    {
                        Ok(_) => break,
                        Err(error) => {
                            eprintln!("simulated agents: failed to patch {name}'s status: {error}");
                            tokio::time::sleep(Duration::from_millis(100 * (attempt + 1))).await;
                        }
                    }
                }
                let line = json!({"name": name, "seen_us": seen_us, "answered_us": unix_micros()});
                if let Ok(mut file) = answers.lock() {
                    let _ = writeln!(file, "{line}");
                }
            });
        }
    }
    Ok(())
}
