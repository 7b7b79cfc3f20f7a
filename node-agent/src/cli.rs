//! Command line of `switchyard-agent`.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::standalone::interfaces::{Globs, DEFAULT_POD_INTERFACE_GLOBS};
use crate::standalone::{SocketHookCgroup, StandaloneOptions};

pub const DEFAULT_PIN_DIRECTORY: &str = "/sys/fs/bpf/switchyard";

#[derive(Debug, Parser)]
#[command(
    name = "switchyard-agent",
    version,
    about = "Switchyard's per-node agent: Services in TC programs."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Program the datapath from manifest files, without a cluster.
    Standalone(StandaloneArguments),
    /// Remove every program, link and map this agent pinned.
    Detach(DetachArguments),
}

#[derive(Debug, Args)]
pub struct StandaloneArguments {
    /// A YAML file or a directory of them (Services, EndpointSlices, DataplaneNode).
    #[arg(long)]
    pub manifests: PathBuf,
    /// Globs (comma-separated) of pod interfaces (host side of pod veths).
    #[arg(long, default_value = DEFAULT_POD_INTERFACE_GLOBS)]
    pub pod_interfaces: String,
    /// Globs of external interfaces; default: every non-loopback interface that is
    /// not a pod interface.
    #[arg(long)]
    pub host_interfaces: Option<String>,
    /// Addresses NodePorts are served on (repeatable); default: the host
    /// interfaces' global addresses.
    #[arg(long = "node-ip")]
    pub node_ips: Vec<IpAddr>,
    /// This node's name: which endpoints are local, which DataplaneNode to follow.
    #[arg(long, env = "NODE_NAME")]
    pub node_name: Option<String>,
    #[arg(long, default_value = DEFAULT_PIN_DIRECTORY)]
    pub bpf_pin_dir: PathBuf,
    /// Remove programs, links and maps on exit (default: leave them serving).
    #[arg(long)]
    pub detach_on_exit: bool,
    /// Minimum time between two applies, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    pub min_sync_period_ms: u64,
    /// How often the manifests and interfaces are checked, in milliseconds.
    #[arg(long, default_value_t = 200)]
    pub poll_interval_ms: u64,
    /// `skb->mark` bit of packets to masquerade.
    #[arg(long, default_value_t = crate::standalone::datapath::DEFAULT_MASQUERADE_MARK)]
    pub masquerade_mark: u32,
    /// Do not install the SWITCHYARD-POSTROUTING masquerade rule.
    #[arg(long)]
    pub no_masquerade_rule: bool,
    /// cgroup v2 directory for the host socket hooks (default: the cgroup v2 root,
    /// so every host process of this network namespace is covered).
    #[arg(long, conflicts_with = "no_socket_hooks")]
    pub cgroup: Option<PathBuf>,
    /// Attach no socket hooks (host processes then get no Service translation).
    #[arg(long)]
    pub no_socket_hooks: bool,
}

#[derive(Debug, Args)]
pub struct DetachArguments {
    #[arg(long, default_value = DEFAULT_PIN_DIRECTORY)]
    pub bpf_pin_dir: PathBuf,
}

/// The host name, as the node name defaults to it (kubelet does the same).
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_string())
        .unwrap_or_default()
}

impl StandaloneArguments {
    pub fn options(&self) -> StandaloneOptions {
        StandaloneOptions {
            manifests: self.manifests.clone(),
            pod_interfaces: Globs::parse(&self.pod_interfaces),
            host_interfaces: self.host_interfaces.as_deref().map(Globs::parse),
            node_ips: self.node_ips.clone(),
            node_name: self.node_name.clone().unwrap_or_else(host_name),
            pin_directory: self.bpf_pin_dir.clone(),
            detach_on_exit: self.detach_on_exit,
            min_sync_period: Duration::from_millis(self.min_sync_period_ms),
            poll_interval: Duration::from_millis(self.poll_interval_ms),
            gate_timeout: Duration::from_secs(30),
            masquerade_mark: self.masquerade_mark,
            manage_masquerade_rule: !self.no_masquerade_rule,
            socket_hook_cgroup: if self.no_socket_hooks {
                SocketHookCgroup::None
            } else {
                match &self.cgroup {
                    Some(path) => SocketHookCgroup::Path(path.clone()),
                    None => SocketHookCgroup::Root,
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_standalone_command_line_of_the_issue_parses() {
        let cli = Cli::try_parse_from([
            "switchyard-agent",
            "standalone",
            "--manifests",
            "/etc/switchyard",
            "--pod-interfaces",
            "veth*,pod*",
            "--host-interfaces",
            "eth0",
            "--node-ip",
            "192.168.1.10",
            "--node-ip",
            "192.168.1.11",
            "--node-name",
            "node-a",
            "--bpf-pin-dir",
            "/sys/fs/bpf/test",
            "--detach-on-exit",
        ])
        .expect("parses");
        let Command::Standalone(arguments) = cli.command else {
            panic!("expected standalone");
        };
        let options = arguments.options();
        assert_eq!(options.node_ips.len(), 2);
        assert_eq!(options.node_name, "node-a");
        assert!(options.detach_on_exit);
        assert!(options.pod_interfaces.matches("pod7"));
        assert!(options.host_interfaces.expect("given").matches("eth0"));
        assert_eq!(options.pin_directory, PathBuf::from("/sys/fs/bpf/test"));
    }

    #[test]
    fn standalone_defaults_follow_the_issue() {
        let cli = Cli::try_parse_from(["switchyard-agent", "standalone", "--manifests", "m.yaml"])
            .expect("parses");
        let Command::Standalone(arguments) = cli.command else {
            panic!("expected standalone");
        };
        let options = arguments.options();
        for name in ["veth0", "cali1", "lxc2"] {
            assert!(options.pod_interfaces.matches(name), "{name}");
        }
        assert_eq!(options.host_interfaces, None);
        assert!(options.node_ips.is_empty());
        assert_eq!(options.pin_directory, PathBuf::from(DEFAULT_PIN_DIRECTORY));
        assert!(!options.detach_on_exit);
    }
}
