//! The parity preflight: Services that use something the eBPF datapath does not serve yet
//! (docs/parity.md). kube-proxy serves them; once it has left a node they stop working there. So a
//! transition to `Ebpf` is refused before any node is activated while such a Service exists, and
//! a cluster that already runs on eBPF, wholly or partly, says so: the `ServicesSupported`
//! condition and a Warning Event on each such Service. Going back to kube-proxy is never held by
//! it.
//!
//! [`UNSUPPORTED_FEATURES`] is the one table of what is not served: a row leaves the table when
//! the datapath learns to serve its feature (`loadBalancerSourceRanges` left it when the datapath
//! learned to filter sources, issue 24).
//!
//! The controller keeps only [`UnsupportedService`] summaries of the Services that use such a
//! feature (a cluster has tens of thousands of Services, nearly all of them served), so what
//! the planner reads stays small.

use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Service, ServiceSpec};
use switchyard_crds::{reasons, ConditionStatus};

use super::name_list;

/// The label of a Service owned by another proxy: kube-proxy's informers never see such
/// Services (selector "label does not exist"), so they are never flagged here either.
pub const SERVICE_PROXY_NAME_LABEL: &str = "service.kubernetes.io/service-proxy-name";

/// A feature of a Service that the eBPF datapath does not serve yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum UnsupportedFeature {
    /// A port with `protocol: SCTP` (issue 24: kube-proxy's SCTP rules are cleaned with the rest).
    SctpPorts,
    /// An IPv6 or dual-stack Service (issue 25: the datapath is IPv4 only).
    Ipv6,
}

/// One row of [`UNSUPPORTED_FEATURES`].
pub struct FeatureRow {
    pub feature: UnsupportedFeature,
    /// How messages name the feature.
    pub named: &'static str,
    /// Whether the spec of a Service kube-proxy proxies uses the feature.
    pub used_by: fn(&ServiceSpec) -> bool,
}

/// What the eBPF datapath does not serve yet, in the order messages list them.
pub const UNSUPPORTED_FEATURES: &[FeatureRow] = &[
    FeatureRow {
        feature: UnsupportedFeature::SctpPorts,
        named: "SCTP ports",
        used_by: has_sctp_ports,
    },
    FeatureRow {
        feature: UnsupportedFeature::Ipv6,
        named: "IPv6",
        used_by: uses_ipv6,
    },
];

impl UnsupportedFeature {
    /// How messages name the feature.
    pub fn named(self) -> &'static str {
        UNSUPPORTED_FEATURES
            .iter()
            .find(|row| row.feature == self)
            .map_or("an unsupported feature", |row| row.named)
    }
}

/// A Service that uses features the eBPF datapath does not serve yet: all the operator keeps of
/// it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnsupportedService {
    pub namespace: String,
    pub name: String,
    /// The Service's UID (for the Events about it).
    pub uid: Option<String>,
    /// In the order of [`UNSUPPORTED_FEATURES`]; never empty.
    pub features: Vec<UnsupportedFeature>,
}

impl UnsupportedService {
    /// The summary of `service`, or `None` when the eBPF datapath serves everything of it that
    /// kube-proxy serves (including Services kube-proxy does not proxy at all).
    pub fn of(service: &Service) -> Option<Self> {
        if !proxied_by_kube_proxy(service) {
            return None;
        }
        let spec = service.spec.as_ref()?;
        let features: Vec<UnsupportedFeature> = UNSUPPORTED_FEATURES
            .iter()
            .filter(|row| (row.used_by)(spec))
            .map(|row| row.feature)
            .collect();
        (!features.is_empty()).then(|| Self {
            namespace: service.metadata.namespace.clone().unwrap_or_default(),
            name: service.metadata.name.clone().unwrap_or_default(),
            uid: service.metadata.uid.clone(),
            features,
        })
    }

    /// `namespace/name (feature, feature)`.
    pub fn describe(&self) -> String {
        let features: Vec<&str> = self
            .features
            .iter()
            .map(|feature| feature.named())
            .collect();
        format!("{}/{} ({})", self.namespace, self.name, features.join(", "))
    }
}

/// Whether kube-proxy proxies `service` at all: not when another proxy owns it (the label), not
/// `ExternalName`, not without a cluster IP (headless `None`, or not allocated yet): kube-proxy's
/// informer selector and `ShouldSkipService`, the same in every version.
pub fn proxied_by_kube_proxy(service: &Service) -> bool {
    let other_proxy = service
        .metadata
        .labels
        .as_ref()
        .is_some_and(|labels| labels.contains_key(SERVICE_PROXY_NAME_LABEL));
    let Some(spec) = service.spec.as_ref() else {
        return false;
    };
    let external_name = spec.type_.as_deref() == Some("ExternalName");
    let has_cluster_ip = spec
        .cluster_ip
        .as_deref()
        .is_some_and(|ip| !ip.is_empty() && ip != "None");
    !other_proxy && !external_name && has_cluster_ip
}

fn has_sctp_ports(spec: &ServiceSpec) -> bool {
    spec.ports
        .iter()
        .flatten()
        .any(|port| port.protocol.as_deref() == Some("SCTP"))
}

/// IPv6 or dual-stack: `ipFamilies` names IPv6 (a dual-stack Service, `RequireDualStack` or
/// `PreferDualStack` in a dual-stack cluster, always lists both families), or a cluster IP is an
/// IPv6 address (an API server that fills no `ipFamilies`).
fn uses_ipv6(spec: &ServiceSpec) -> bool {
    let families = spec
        .ip_families
        .iter()
        .flatten()
        .any(|family| family == "IPv6");
    let addresses = spec
        .cluster_ip
        .iter()
        .chain(spec.cluster_ips.iter().flatten())
        .any(|ip| matches!(ip.parse::<IpAddr>(), Ok(IpAddr::V6(_))));
    families || addresses
}

/// `services` in namespace/name order, each once (so messages do not depend on list order).
pub(crate) fn in_order(services: &[Arc<UnsupportedService>]) -> Vec<Arc<UnsupportedService>> {
    let mut ordered = services.to_vec();
    ordered
        .sort_by(|left, right| (&left.namespace, &left.name).cmp(&(&right.namespace, &right.name)));
    ordered.dedup_by(|later, earlier| {
        later.namespace == earlier.namespace && later.name == earlier.name
    });
    ordered
}

/// `N Service(s) use what the eBPF datapath does not serve yet: a/b (SCTP ports), ...`, naming at
/// most ten.
pub(crate) fn unsupported_summary(services: &[Arc<UnsupportedService>]) -> String {
    let described: Vec<String> = services.iter().map(|service| service.describe()).collect();
    format!(
        "{} Service(s) use what the eBPF datapath does not serve yet: {}",
        services.len(),
        name_list(described.iter().map(String::as_str))
    )
}

/// The `ServicesSupported` condition as (status, reason, message). `ebpf_serves` says whether
/// eBPF serves some node (those Services then do not work there).
pub(crate) fn services_condition(
    services: &[Arc<UnsupportedService>],
    ebpf_serves: bool,
) -> (ConditionStatus, &'static str, String) {
    if services.is_empty() {
        return (
            ConditionStatus::True,
            reasons::ALL_SERVICES_SUPPORTED,
            "every Service uses only what the eBPF datapath serves".into(),
        );
    }
    let consequence = if ebpf_serves {
        "they do not work as kube-proxy served them on the nodes eBPF serves: remove those features, or go back with spec.mode KubeProxy"
    } else {
        "kube-proxy serves them; a transition to Ebpf is refused while they exist"
    };
    (
        ConditionStatus::False,
        reasons::UNSUPPORTED_SERVICES,
        format!("{}; {consequence}", unsupported_summary(services)),
    )
}
