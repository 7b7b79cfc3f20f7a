//! Where a running e2e cluster keeps its files, and the client to reach it.
//!
//! `e2e/cluster up` writes certificates, kubeconfigs, logs and per-node facts
//! under one state directory (`SWITCHYARD_E2E_STATE`, by default
//! `/var/lib/switchyard-e2e`). The API server is reachable only from inside the
//! cluster's private network namespace, so code using [`admin_client`] runs
//! there (`e2e/cluster exec ...`).

use std::path::{Path, PathBuf};

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use crate::error::{E2eError, Result};

/// The state directory's default location, as in `e2e/cluster`.
pub const DEFAULT_STATE_DIRECTORY: &str = "/var/lib/switchyard-e2e";

/// The layout of a cluster's state directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterPaths {
    pub state: PathBuf,
}

impl ClusterPaths {
    /// The state directory named by `SWITCHYARD_E2E_STATE`, or the default.
    pub fn from_environment() -> Self {
        Self::from_state_override(std::env::var_os("SWITCHYARD_E2E_STATE").map(PathBuf::from))
    }

    pub fn from_state_override(state: Option<PathBuf>) -> Self {
        let state = state
            .filter(|path| !path.as_os_str().is_empty())
            .unwrap_or_else(|| PathBuf::from(DEFAULT_STATE_DIRECTORY));
        Self { state }
    }

    pub fn admin_kubeconfig(&self) -> PathBuf {
        self.state.join("admin.kubeconfig")
    }

    pub fn node_directory(&self, node: &str) -> PathBuf {
        self.state.join("nodes").join(node)
    }

    /// The file holding the PID (in the cluster's PID namespace) of the process
    /// that holds a node's mount namespace.
    pub fn node_holder_pid_file(&self, node: &str) -> PathBuf {
        self.node_directory(node).join("holder.pid")
    }

    pub fn node_address_file(&self, node: &str) -> PathBuf {
        self.node_directory(node).join("address")
    }

    pub fn pods_directory(&self) -> PathBuf {
        self.state.join("pods")
    }

    /// Where the pod runner keeps one process's files: `output.log` (its
    /// standard output and error) and `serviceaccount/`.
    pub fn process_directory(
        &self,
        namespace: &str,
        pod: &str,
        pod_uid: &str,
        container: &str,
    ) -> PathBuf {
        let uid_prefix: String = pod_uid.chars().take(8).collect();
        self.pods_directory()
            .join(format!("{namespace}_{pod}_{uid_prefix}"))
            .join(container)
    }

    /// One JSON object per line for every process the pod runner started,
    /// signalled or saw exit.
    pub fn pod_runner_events(&self) -> PathBuf {
        self.state.join("logs").join("pod-runner-events.jsonl")
    }

    pub fn audit_log(&self) -> PathBuf {
        self.state.join("logs").join("audit.log")
    }

    pub fn node_count_file(&self) -> PathBuf {
        self.state.join("node-count")
    }

    /// The `e2e/cluster` script (found beside this crate's manifest, or named
    /// by `SWITCHYARD_E2E_CLUSTER_SCRIPT`).
    pub fn cluster_script() -> PathBuf {
        std::env::var_os("SWITCHYARD_E2E_CLUSTER_SCRIPT")
            .map(PathBuf::from)
            .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("cluster"))
    }

    pub fn node_address(&self, node: &str) -> Result<String> {
        read_trimmed(&self.node_address_file(node))
    }

    pub fn node_count(&self) -> Result<usize> {
        let path = self.node_count_file();
        let text = read_trimmed(&path)?;
        text.parse().map_err(|_| E2eError::ReadFile {
            path,
            source: std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("not a node count: {text:?}"),
            ),
        })
    }
}

pub(crate) fn read_trimmed(path: &Path) -> Result<String> {
    std::fs::read_to_string(path)
        .map(|text| text.trim().to_string())
        .map_err(|source| E2eError::ReadFile {
            path: path.to_path_buf(),
            source,
        })
}

/// A client from a kubeconfig file (its current context).
pub async fn client_from_kubeconfig(path: &Path) -> Result<Client> {
    let kubeconfig = Kubeconfig::read_from(path).map_err(|source| E2eError::ReadKubeconfig {
        path: path.to_path_buf(),
        source,
    })?;
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|source| E2eError::ReadKubeconfig {
            path: path.to_path_buf(),
            source,
        })?;
    Client::try_from(config).map_err(|source| E2eError::BuildClient {
        path: path.to_path_buf(),
        source: Box::new(source),
    })
}

/// The cluster administrator's client (`system:masters`).
pub async fn admin_client(paths: &ClusterPaths) -> Result<Client> {
    client_from_kubeconfig(&paths.admin_kubeconfig()).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_state_directory_defaults_when_the_override_is_missing_or_empty() {
        assert_eq!(
            ClusterPaths::from_state_override(None).state,
            PathBuf::from(DEFAULT_STATE_DIRECTORY)
        );
        assert_eq!(
            ClusterPaths::from_state_override(Some(PathBuf::new())).state,
            PathBuf::from(DEFAULT_STATE_DIRECTORY)
        );
        assert_eq!(
            ClusterPaths::from_state_override(Some(PathBuf::from("/tmp/x"))).admin_kubeconfig(),
            PathBuf::from("/tmp/x/admin.kubeconfig")
        );
    }

    #[test]
    fn node_files_live_under_the_node_directory() {
        let paths = ClusterPaths::from_state_override(Some(PathBuf::from("/s")));
        assert_eq!(
            paths.node_holder_pid_file("node-2"),
            PathBuf::from("/s/nodes/node-2/holder.pid")
        );
        assert_eq!(
            paths.node_address_file("node-2"),
            PathBuf::from("/s/nodes/node-2/address")
        );
    }

    #[tokio::test]
    async fn a_client_is_built_from_a_kubeconfig_with_certificate_files() {
        let directory =
            std::env::temp_dir().join(format!("sy-e2e-kubeconfig-{}", std::process::id()));
        std::fs::create_dir_all(&directory).unwrap();
        let path = directory.join("test.kubeconfig");
        std::fs::write(
            &path,
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:1\n    insecure-skip-tls-verify: true\nusers:\n- name: u\n  user:\n    token: abc\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n",
        )
        .unwrap();
        let result = client_from_kubeconfig(&path).await;
        std::fs::remove_dir_all(&directory).unwrap();
        let client = result.expect("a valid kubeconfig gives a client");
        assert_eq!(client.default_namespace(), "default");
    }

    #[tokio::test]
    async fn a_missing_kubeconfig_names_its_path_in_the_error() {
        let Err(error) = client_from_kubeconfig(Path::new("/nonexistent/admin.kubeconfig")).await
        else {
            panic!("a missing file must be an error");
        };
        let message = error.to_string();
        assert!(
            message.starts_with("failed to read the kubeconfig /nonexistent/admin.kubeconfig"),
            "{message}"
        );
    }
}
