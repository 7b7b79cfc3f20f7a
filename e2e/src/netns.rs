//! Network namespaces of the e2e cluster, seen from inside its private
//! namespace: pod namespaces on a node, external namespaces on the node
//! bridge, and threads that create sockets inside any of them.
//!
//! A socket belongs to the network namespace of the thread that created it,
//! whatever thread uses it later. So a [`NamespaceThread`] enters a namespace
//! once (setns on its own thread only) and creates sockets there on request;
//! the async code connects and reads them as usual.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc;

use crate::cluster::ClusterPaths;
use crate::error::{E2eError, Result};

type Job = Box<dyn FnOnce() + Send>;

/// A thread living inside one network namespace (or the caller's, for `None`).
#[derive(Debug, Clone)]
pub struct NamespaceThread {
    label: String,
    jobs: mpsc::Sender<Job>,
}

impl NamespaceThread {
    /// Starts a thread in the namespace at `path` (e.g. `/run/netns/<name>`),
    /// or in the current one for `None`.
    pub fn start(path: Option<&Path>) -> Result<Self> {
        let label = path
            .map(|path| path.display().to_string())
            .unwrap_or_else(|| "the current network namespace".to_string());
        let (jobs, receiver) = mpsc::channel::<Job>();
        let (entered, entered_receiver) = mpsc::channel::<std::io::Result<()>>();
        let target = path.map(Path::to_path_buf);
        std::thread::Builder::new()
            .name(format!("netns {label}"))
            .spawn(move || {
                let result = match &target {
                    Some(path) => enter_network_namespace(path),
                    None => Ok(()),
                };
                let ok = result.is_ok();
                let _ = entered.send(result);
                if ok {
                    while let Ok(job) = receiver.recv() {
                        job();
                    }
                }
            })
            .map_err(|source| E2eError::EnterNetworkNamespace {
                path: path.map(Path::to_path_buf).unwrap_or_default(),
                source,
            })?;
        let entered = entered_receiver.recv().unwrap_or_else(|_| {
            Err(std::io::Error::other(
                "the namespace thread ended before entering",
            ))
        });
        entered.map_err(|source| E2eError::EnterNetworkNamespace {
            path: path.map(Path::to_path_buf).unwrap_or_default(),
            source,
        })?;
        Ok(Self { label, jobs })
    }

    pub fn label(&self) -> &str {
        &self.label
    }

    /// Runs `job` on the namespace's thread and returns its result.
    pub async fn run<T, F>(&self, job: F) -> std::io::Result<T>
    where
        T: Send + 'static,
        F: FnOnce() -> std::io::Result<T> + Send + 'static,
    {
        let (sender, receiver) = tokio::sync::oneshot::channel();
        self.jobs
            .send(Box::new(move || {
                let _ = sender.send(job());
            }))
            .map_err(|_| std::io::Error::other("the namespace thread has ended"))?;
        receiver
            .await
            .map_err(|_| std::io::Error::other("the namespace thread dropped the job"))?
    }

    /// A new IPv4 TCP socket inside the namespace.
    pub async fn tcp_socket(&self) -> std::io::Result<tokio::net::TcpSocket> {
        self.run(tokio::net::TcpSocket::new_v4).await
    }

    /// A bound, listening TCP socket inside the namespace.
    pub async fn tcp_listener(
        &self,
        address: std::net::SocketAddr,
    ) -> std::io::Result<std::net::TcpListener> {
        self.run(move || {
            let listener = std::net::TcpListener::bind(address)?;
            listener.set_nonblocking(true)?;
            Ok(listener)
        })
        .await
    }
}

fn enter_network_namespace(path: &Path) -> std::io::Result<()> {
    let file = std::fs::File::open(path)?;
    use std::os::fd::AsRawFd;
    // SAFETY: setns only reads the descriptor, which `file` keeps open for the
    // duration of the call; it changes the namespace of this thread only.
    let result = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
    if result == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The path of a named network namespace inside the cluster.
pub fn named_namespace_path(name: &str) -> PathBuf {
    PathBuf::from("/run/netns").join(name)
}

/// A network namespace made for a test (a pod on a node, or an external
/// client on the bridge); deleted when dropped.
#[derive(Debug)]
pub struct TestNamespace {
    pub name: String,
    pub address: std::net::Ipv4Addr,
}

impl TestNamespace {
    /// A pod namespace on node `node-<node_index>` with address
    /// `10.244.<node_index>.<host_number>` (host numbers 2..=254).
    pub fn pod(node_index: usize, name: &str, host_number: u8) -> Result<Self> {
        Self::create(
            &[
                "_pod-netns-add",
                &node_index.to_string(),
                name,
                &host_number.to_string(),
            ],
            name,
        )
    }

    /// An external namespace on the node bridge with address
    /// `10.99.0.<host_number>` (host numbers 100..=250), outside every node.
    pub fn external(name: &str, host_number: u8) -> Result<Self> {
        Self::create(
            &["_external-netns-add", name, &host_number.to_string()],
            name,
        )
    }

    fn create(arguments: &[&str], name: &str) -> Result<Self> {
        let output = run_cluster_script(arguments)?;
        let address = output.trim().parse().map_err(|_| E2eError::RunCommand {
            command: format!("e2e/cluster {}", arguments.join(" ")),
            message: format!("expected an IPv4 address, got {output:?}"),
        })?;
        Ok(Self {
            name: name.to_string(),
            address,
        })
    }

    pub fn path(&self) -> PathBuf {
        named_namespace_path(&self.name)
    }

    pub fn thread(&self) -> Result<NamespaceThread> {
        NamespaceThread::start(Some(&self.path()))
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        if let Err(error) = run_cluster_script(&["_netns-delete", &self.name]) {
            eprintln!("{error}");
        }
    }
}

fn run_cluster_script(arguments: &[&str]) -> Result<String> {
    let script = ClusterPaths::cluster_script();
    let mut command = Command::new("bash");
    command
        .arg(&script)
        .args(arguments)
        .env("SWITCHYARD_E2E_INSIDE", "1");
    standard_output_of(
        command,
        format!("{} {}", script.display(), arguments.join(" ")),
    )
}

/// Runs a command inside a named network namespace of the cluster (e.g.
/// `iptables-save` in `node-1`) and returns its standard output.
pub fn run_in_namespace(name: &str, program: &str, arguments: &[&str]) -> Result<String> {
    let mut command = Command::new("ip");
    command
        .args(["netns", "exec", name, program])
        .args(arguments);
    standard_output_of(
        command,
        format!("ip netns exec {name} {program} {}", arguments.join(" ")),
    )
}

/// Runs a command inside a node's network and mount namespaces (where its
/// processes run: its own bpffs at /sys/fs/bpf, /run, hosts file) and returns
/// its standard output. Must be called from inside the cluster.
pub fn run_in_node(
    paths: &ClusterPaths,
    node: &str,
    program: &str,
    arguments: &[&str],
) -> Result<String> {
    let holder = crate::cluster::read_trimmed(&paths.node_holder_pid_file(node))?;
    let mut command = Command::new("nsenter");
    command
        .args(["-t", &holder, "-n", "-m", "--", program])
        .args(arguments);
    standard_output_of(
        command,
        format!(
            "nsenter -t {holder} -n -m -- {program} {}",
            arguments.join(" ")
        ),
    )
}

/// Runs `command` to completion: its standard output, or an error naming it
/// (`description`) with its exit status and standard error.
fn standard_output_of(mut command: Command, description: String) -> Result<String> {
    let output = command.output().map_err(|error| E2eError::RunCommand {
        command: description.clone(),
        message: error.to_string(),
    })?;
    if !output.status.success() {
        return Err(E2eError::RunCommand {
            command: description,
            message: format!(
                "{}: {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            ),
        });
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_thread_in_the_current_namespace_creates_working_sockets() {
        let thread = NamespaceThread::start(None).unwrap();
        let listener = thread
            .tcp_listener("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let address = listener.local_addr().unwrap();
        let listener = tokio::net::TcpListener::from_std(listener).unwrap();
        let socket = thread.tcp_socket().await.unwrap();
        let (connected, accepted) = tokio::join!(socket.connect(address), listener.accept());
        assert!(connected.is_ok() && accepted.is_ok());
    }

    #[test]
    fn a_failing_command_is_named_with_its_status_and_standard_error() {
        let mut command = Command::new("sh");
        command.args(["-c", "echo out; echo broken >&2; exit 3"]);
        let error = standard_output_of(command, "sh -c test".into()).unwrap_err();
        let text = error.to_string();
        assert!(
            text.contains("sh -c test") && text.contains("broken") && text.contains('3'),
            "{text}"
        );
        let mut command = Command::new("sh");
        command.args(["-c", "echo out"]);
        assert_eq!(
            standard_output_of(command, "sh -c echo".into()).unwrap(),
            "out\n"
        );
    }

    #[test]
    fn entering_a_missing_namespace_fails_with_its_path() {
        let error = NamespaceThread::start(Some(Path::new("/nonexistent/netns"))).unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("failed to enter the network namespace /nonexistent/netns"),
            "{error}"
        );
    }
}
