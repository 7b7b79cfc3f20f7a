//! The recorder: every version of the watched objects, with its etcd revision, so that the
//! scenarios prove orderings by revision rather than by the timing of polls.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use futures::StreamExt;
use kube::api::ListParams;
use kube::runtime::watcher;
use kube::{Api, Resource};

use super::Outcome;

#[derive(Clone, Debug)]
pub struct Version<K> {
    /// The object's resourceVersion: its etcd revision (for a deletion, the deletion's).
    pub revision: u64,
    pub received: SystemTime,
    pub deleted: bool,
    pub object: K,
}

pub type History<K> = Arc<Mutex<Vec<Version<K>>>>;

/// Records every version of the objects of `api` (list, then watch) until dropped.
pub struct Recorder<K: Clone> {
    pub history: History<K>,
    /// Set once the initial list is recorded: from then on every later write is seen.
    listed: Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl<K> Recorder<K>
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    pub fn start(api: Api<K>) -> Self {
        let history: History<K> = Arc::new(Mutex::new(Vec::new()));
        let listed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let shared = history.clone();
        let shared_listed = listed.clone();
        let task = tokio::spawn(async move {
            let mut events = watcher(api, watcher::Config::default()).boxed();
            while let Some(event) = events.next().await {
                let (object, deleted) = match event {
                    Ok(watcher::Event::Apply(object)) | Ok(watcher::Event::InitApply(object)) => {
                        (object, false)
                    }
                    Ok(watcher::Event::Delete(object)) => (object, true),
                    Ok(watcher::Event::InitDone) => {
                        shared_listed.store(true, std::sync::atomic::Ordering::SeqCst);
                        continue;
                    }
                    _ => continue,
                };
                let revision = object
                    .meta()
                    .resource_version
                    .as_deref()
                    .and_then(|version| version.parse().ok())
                    .unwrap_or(0);
                if let Ok(mut history) = shared.lock() {
                    history.push(Version {
                        revision,
                        received: SystemTime::now(),
                        deleted,
                        object,
                    });
                }
            }
        });
        Self {
            history,
            listed,
            task,
        }
    }

    /// Starts recording and returns once the initial list is in: a write made after this
    /// returns is recorded with its own revision (a recorder still listing would see only
    /// the state after it).
    pub async fn start_listed(api: Api<K>) -> Outcome<Self> {
        let recorder = Self::start(api);
        let started = Instant::now();
        while !recorder.listed.load(std::sync::atomic::Ordering::SeqCst) {
            if started.elapsed() > RECORDER_WAIT {
                return Err(format!(
                    "failed to list {} within {RECORDER_WAIT:?}",
                    K::plural(&K::DynamicType::default())
                )
                .into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(recorder)
    }

    pub fn versions(&self) -> Vec<Version<K>> {
        self.history
            .lock()
            .map(|history| history.clone())
            .unwrap_or_default()
    }

    /// The highest revision recorded so far (a marker: what happens later has a higher one).
    pub fn latest_revision(&self) -> u64 {
        self.versions()
            .iter()
            .map(|version| version.revision)
            .max()
            .unwrap_or(0)
    }

    /// Waits until the recorder has seen every object `api` lists now at its current
    /// revision (a watch delivers a moment after the write): the history then holds every
    /// earlier version too, since a watch delivers in revision order.
    pub async fn wait_caught_up(&self, api: &Api<K>) -> Outcome<()> {
        let started = Instant::now();
        loop {
            let current = api.list(&ListParams::default()).await?;
            let versions = self.versions();
            let behind: Vec<String> = current
                .items
                .iter()
                .filter(|object| {
                    let revision: u64 = object
                        .meta()
                        .resource_version
                        .as_deref()
                        .and_then(|version| version.parse().ok())
                        .unwrap_or(0);
                    !versions.iter().any(|version| {
                        version.object.meta().name == object.meta().name
                            && version.revision >= revision
                    })
                })
                .filter_map(|object| object.meta().name.clone())
                .collect();
            if behind.is_empty() {
                return Ok(());
            }
            if started.elapsed() > RECORDER_WAIT {
                return Err(format!(
                    "failed to see the recorder catch up within {RECORDER_WAIT:?}: behind on {behind:?}"
                )
                .into());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until the recorded versions satisfy `recorded` (e.g. a deletion the API no longer
    /// lists has reached the watch).
    pub async fn wait_recorded(
        &self,
        description: &str,
        recorded: impl Fn(&[Version<K>]) -> bool,
    ) -> Outcome<()> {
        let started = Instant::now();
        while !recorded(&self.versions()) {
            if started.elapsed() > RECORDER_WAIT {
                return Err(
                    format!("failed to record {description} within {RECORDER_WAIT:?}").into(),
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }
}

/// How long a recorder may take to list, or to receive a write the API server already shows.
const RECORDER_WAIT: Duration = Duration::from_secs(30);

impl<K: Clone> Drop for Recorder<K> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The first version after `after` for which `test` holds, per object name.
/// The etcd revision at which the pod named `pod_name` was seen deleted, if it was.
pub fn revision_deleted<K: Resource + Clone>(
    versions: &[Version<K>],
    pod_name: &str,
) -> Option<u64> {
    versions
        .iter()
        .filter(|version| {
            version.deleted && version.object.meta().name.as_deref() == Some(pod_name)
        })
        .map(|version| version.revision)
        .min()
}

pub fn first_revision_where<K: Resource + Clone>(
    versions: &[Version<K>],
    after: u64,
    name: &str,
    test: impl Fn(&Version<K>) -> bool,
) -> Option<u64> {
    versions
        .iter()
        .filter(|version| version.revision > after)
        .filter(|version| version.object.meta().name.as_deref() == Some(name))
        .filter(|version| test(version))
        .map(|version| version.revision)
        .min()
}
