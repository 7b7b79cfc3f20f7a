//! Thin I/O: runs `iptables-{legacy,nft}-save/-restore` (and the ip6tables ones),
//! `nft` and `ip`, and applies the plans the pure modules compute. Blocking (the
//! tools take milliseconds); call it from `spawn_blocking` in async code.

use std::{
    io::Write as _,
    process::{Command, Stdio},
};

use super::{
    chain_order::{
        agent_chains, check_chain_order, plan_agent_chain_removal, plan_chain_order_repair,
    },
    detection::ConditionReport,
    nftables::NftRuleset,
    ownership::is_kube_proxy_chain,
    ruleset::SavedRuleset,
    Backend, Family, IptablesDump, NodeCleanupPlan, NodeRules,
};
use crate::Error;

/// `ChainOrderSafe` False: the repair did not leave the agent's chains first.
pub const CHAIN_ORDER_REPAIR_FAILED: &str = "ChainOrderRepairFailed";

/// Runs the netfilter tools, optionally inside another network namespace (the
/// privileged tests run them under `ip netns exec NAME`).
#[derive(Clone, Debug, Default)]
pub struct Tools {
    prefix: Vec<String>,
}

impl Tools {
    /// The tools of the agent's own network namespace (the node's).
    pub fn new() -> Self {
        Self::default()
    }

    /// The tools run inside the named network namespace (`ip netns exec NAME`).
    pub fn in_network_namespace(name: &str) -> Self {
        Self {
            prefix: vec!["ip".into(), "netns".into(), "exec".into(), name.into()],
        }
    }

    fn command(&self, program: &str) -> Command {
        match self.prefix.split_first() {
            Some((first, rest)) => {
                let mut command = Command::new(first);
                command.args(rest).arg(program);
                command
            }
            None => Command::new(program),
        }
    }

    /// Runs `program arguments`, feeding `input`; `Ok(None)` when the program is not
    /// installed (a node without the legacy tools simply has no legacy backend).
    fn run(
        &self,
        program: &str,
        arguments: &[&str],
        input: Option<&str>,
    ) -> Result<Option<String>, Error> {
        let described = format!("{program} {}", arguments.join(" "));
        let mut command = self.command(program);
        command
            .args(arguments)
            .stdin(if input.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(error) => {
                return Err(Error::RunNetfilterTool {
                    command: described,
                    source: Box::new(error),
                })
            }
        };
        if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
            stdin
                .write_all(text.as_bytes())
                .map_err(|error| Error::RunNetfilterTool {
                    command: described.clone(),
                    source: Box::new(error),
                })?;
        }
        let output = child
            .wait_with_output()
            .map_err(|error| Error::RunNetfilterTool {
                command: described.clone(),
                source: Box::new(error),
            })?;
        // Under `ip netns exec`, a missing program shows as exit status 255 with
        // "No such file or directory"; treat it as missing too.
        let stderr = String::from_utf8_lossy(&output.stderr).trim().to_string();
        if !self.prefix.is_empty()
            && output.status.code() == Some(255)
            && stderr.contains("No such file or directory")
        {
            return Ok(None);
        }
        if !output.status.success() {
            return Err(Error::RunNetfilterTool {
                command: described,
                source: format!("{}: {stderr}", output.status).into(),
            });
        }
        Ok(Some(String::from_utf8_lossy(&output.stdout).into_owned()))
    }

    /// One backend's dump of one family; `None` when its tools are not installed.
    pub fn save(&self, backend: Backend, family: Family) -> Result<Option<SavedRuleset>, Error> {
        match self.run(&backend.tool(family, "save"), &[], None)? {
            Some(text) => SavedRuleset::parse(&text).map(Some),
            None => Ok(None),
        }
    }

    /// Feeds `input` to `iptables-restore --noflush` of that backend and family.
    pub fn restore(&self, backend: Backend, family: Family, input: &str) -> Result<(), Error> {
        if input.is_empty() {
            return Ok(());
        }
        let program = backend.tool(family, "restore");
        match self.run(&program, &["--noflush", "-w", "5"], Some(input))? {
            Some(_) => Ok(()),
            None => Err(Error::RunNetfilterTool {
                command: program,
                source: "not installed".into(),
            }),
        }
    }

    /// `nft -j list ruleset`; empty when nft is not installed.
    pub fn nft_ruleset(&self) -> Result<NftRuleset, Error> {
        match self.run("nft", &["-j", "list", "ruleset"], None)? {
            Some(text) if text.trim().is_empty() => Ok(NftRuleset::default()),
            Some(text) => NftRuleset::parse_json(&text),
            None => Ok(NftRuleset::default()),
        }
    }

    /// Runs an nft script as one transaction.
    pub fn nft_apply(&self, script: &str) -> Result<(), Error> {
        if script.is_empty() {
            return Ok(());
        }
        match self.run("nft", &["-f", "-"], Some(script))? {
            Some(_) => Ok(()),
            None => Err(Error::RunNetfilterTool {
                command: "nft".into(),
                source: "not installed".into(),
            }),
        }
    }

    /// Names of the network interfaces (for `kube-ipvs0`).
    pub fn interface_names(&self) -> Result<Vec<String>, Error> {
        let Some(text) = self.run("ip", &["-o", "link", "show"], None)? else {
            return Err(Error::RunNetfilterTool {
                command: "ip".into(),
                source: "not installed".into(),
            });
        };
        // `2: eth0@if5: <BROADCAST,...> ...`
        Ok(text
            .lines()
            .filter_map(|line| line.split(": ").nth(1))
            .map(|name| name.split('@').next().unwrap_or(name).to_string())
            .collect())
    }

    /// The backend plain `iptables` uses on this node (`iptables --version` says
    /// `(nf_tables)` or `(legacy)`); where the agent's chains go when kube-proxy's
    /// rules are nowhere.
    pub fn default_backend(&self) -> Backend {
        match self.run("iptables", &["--version"], None) {
            Ok(Some(text)) if text.contains("nf_tables") => Backend::Nft,
            Ok(Some(_)) => Backend::Legacy,
            _ => Backend::Nft,
        }
    }

    /// Reads every backend of `families` that has anything in it, and the nftables
    /// tables of those families.
    pub fn read_node_rules(&self, families: &[Family]) -> Result<NodeRules, Error> {
        let mut nftables = self.nft_ruleset()?;
        nftables.retain_families(families);
        let mut rules = NodeRules {
            nftables,
            ..NodeRules::default()
        };
        for family in families {
            for backend in Backend::ALL {
                if let Some(ruleset) = self.save(backend, *family)? {
                    if ruleset.has_content() {
                        rules.iptables.push(IptablesDump {
                            backend,
                            family: *family,
                            ruleset,
                        });
                    }
                }
            }
        }
        Ok(rules)
    }

    /// Applies a cleanup plan: each backend's restore (atomic per table), then the
    /// nft transaction. Stops at the first failure; the next round re-plans from
    /// what is actually there.
    pub fn apply_cleanup(&self, plan: &NodeCleanupPlan) -> Result<(), Error> {
        for cleanup in &plan.iptables {
            self.restore(
                cleanup.backend,
                cleanup.family,
                &cleanup.plan.restore_input(),
            )
            .map_err(|error| Error::CleanUpKubeProxyRules {
                backend: format!(
                    "{} {}",
                    cleanup.backend.name(),
                    cleanup.family.iptables_command()
                ),
                source: Box::new(error),
            })?;
        }
        self.nft_apply(&plan.nftables.script())
            .map_err(|error| Error::CleanUpKubeProxyRules {
                backend: "nftables".to_string(),
                source: Box::new(error),
            })
    }

    /// The backends the chain-order guard works in: every backend holding a
    /// kube-proxy chain or already the agent's chains, and the default one.
    pub fn guarded_backends(&self, family: Family) -> Result<Vec<Backend>, Error> {
        let mut backends = vec![self.default_backend()];
        for backend in Backend::ALL {
            if backends.contains(&backend) {
                continue;
            }
            let Some(ruleset) = self.save(backend, family)? else {
                continue;
            };
            let relevant = ruleset.tables.iter().any(|table| {
                table.chains.iter().any(|chain| {
                    is_kube_proxy_chain(&chain.name)
                        || chain.name == super::chain_order::FORWARD_CHAIN
                        || chain.name == super::chain_order::POSTROUTING_CHAIN
                })
            });
            if relevant {
                backends.push(backend);
            }
        }
        Ok(backends)
    }

    /// Checks the agent's chains in every guarded backend and repairs them where
    /// needed; returns `ChainOrderSafe` as found after the repair.
    pub fn guard_chain_order(
        &self,
        family: Family,
        masquerade_mark: u32,
    ) -> Result<ConditionReport, Error> {
        let chains = agent_chains(masquerade_mark);
        let mut restored = Vec::new();
        for backend in self.guarded_backends(family)? {
            let ruleset = self.save(backend, family)?.unwrap_or_default();
            let before = check_chain_order(&ruleset, &chains);
            if before.safe() {
                continue;
            }
            let repair = plan_chain_order_repair(&ruleset, &chains);
            self.restore(backend, family, &repair)
                .map_err(|error| Error::GuardChainOrder {
                    backend: backend.name(),
                    source: Box::new(error),
                })?;
            let after =
                check_chain_order(&self.save(backend, family)?.unwrap_or_default(), &chains);
            if !after.safe() {
                return Ok(ConditionReport {
                    status: false,
                    reason: CHAIN_ORDER_REPAIR_FAILED,
                    message: format!(
                        "{}: still unsafe after the repair: {:?}",
                        backend.name(),
                        after.problems
                    ),
                });
            }
            let displaced = before.displaced_by();
            restored.push(if displaced.is_empty() {
                format!("{}: created", backend.name())
            } else {
                format!(
                    "{}: moved ahead of {}",
                    backend.name(),
                    displaced.join("; ")
                )
            });
        }
        Ok(if restored.is_empty() {
            ConditionReport {
                status: true,
                reason: switchyard_crds::reasons::CHAIN_ORDER_VERIFIED,
                message: "the agent's chains come first in FORWARD and POSTROUTING".into(),
            }
        } else {
            ConditionReport {
                status: true,
                reason: switchyard_crds::reasons::CHAIN_ORDER_RESTORED,
                message: format!(
                    "the agent's chains were put back first ({})",
                    restored.join(", ")
                ),
            }
        })
    }

    /// Removes the agent's chains from every backend (the node left eBPF).
    pub fn remove_agent_chains(&self, family: Family, masquerade_mark: u32) -> Result<(), Error> {
        let chains = agent_chains(masquerade_mark);
        for backend in Backend::ALL {
            let Some(ruleset) = self.save(backend, family)? else {
                continue;
            };
            self.restore(
                backend,
                family,
                &plan_agent_chain_removal(&ruleset, &chains),
            )
            .map_err(|error| Error::GuardChainOrder {
                backend: backend.name(),
                source: Box::new(error),
            })?;
        }
        Ok(())
    }
}
