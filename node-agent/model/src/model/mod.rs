//! Kubernetes objects -> the agent's internal Service model.
//!
//! The model keeps only what the datapath needs, already validated and typed:
//! addresses are `IpAddr`, ports are `u16`, policies are enums. Conversion follows
//! kube-proxy's reading of the API, so that the eBPF datapath and kube-proxy agree
//! on what a Service means:
//! - ExternalName Services and Services without a cluster IP (headless, or not yet
//!   allocated) are ignored (kube-proxy's `ShouldSkipService`).
//! - Node ports count only for `type: NodePort` and `type: LoadBalancer`.
//! - Load-balancer ingress addresses count only for `type: LoadBalancer` and not
//!   with `ipMode: Proxy` (the load balancer proxies, so the node must not capture
//!   the address: KEP-1860).
//! - SCTP ports are skipped: the datapath translates TCP and UDP.
//! - An endpoint's conditions default as the API documents: unknown `ready` is
//!   ready, unknown `serving` is the value of `ready`, unknown `terminating` is
//!   not terminating. Only an endpoint's first address is used, as kube-proxy does.
//! - Services and EndpointSlices that kube-proxy's label selector hides
//!   (`service.kubernetes.io/service-proxy-name`, `service.kubernetes.io/headless`)
//!   are ignored ([`labels`]).
//! - An endpoint's topology hints (`hints.forZones`, `hints.forNodes`) are kept
//!   for the desired state's topology-aware choice.
//! - A slice's `endpoints.kubernetes.io/last-change-trigger-time` annotation is
//!   kept for kube-proxy's network programming latency metric; a value that does
//!   not parse is no time, as in kube-proxy.

pub mod labels;
pub mod source_ranges;
pub mod v1beta1;

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;
use std::time::SystemTime;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// Label that ties an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// The time of the change (of a Pod or Service) that made the EndpointSlice
/// controller write the slice, RFC 3339 with nanoseconds (`v1.EndpointsLastChangeTriggerTime`).
pub const LAST_CHANGE_TRIGGER_TIME_ANNOTATION: &str =
    "endpoints.kubernetes.io/last-change-trigger-time";
/// Topology key that v1beta1 EndpointSlices use for the endpoint's node.
pub const HOSTNAME_TOPOLOGY_KEY: &str = "kubernetes.io/hostname";
/// `sessionAffinityConfig.clientIP.timeoutSeconds` when unset (3 hours).
pub const DEFAULT_AFFINITY_TIMEOUT_SECONDS: u32 = 10_800;
/// The API's upper bound for the affinity timeout (one day).
pub const MAX_AFFINITY_TIMEOUT_SECONDS: u32 = 86_400;

/// A field of a Kubernetes object that the agent cannot use, with the reason.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct FieldError {
    /// Path of the field, as in the object's YAML (`spec.ports[1].port`).
    pub field: String,
    pub reason: String,
}

impl FieldError {
    fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

/// Namespace and name of a Service.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServiceName {
    pub namespace: String,
    pub name: String,
}

impl ServiceName {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl fmt::Display for ServiceName {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "{}/{}", self.namespace, self.name)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    Tcp,
    Udp,
}

impl Protocol {
    /// The IP protocol number, as in the map keys.
    pub fn number(self) -> u8 {
        match self {
            Protocol::Tcp => switchyard_common::PROTOCOL_TCP,
            Protocol::Udp => switchyard_common::PROTOCOL_UDP,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AddressFamily {
    Ipv4,
    Ipv6,
}

impl AddressFamily {
    pub fn of(address: &IpAddr) -> Self {
        match address {
            IpAddr::V4(_) => AddressFamily::Ipv4,
            IpAddr::V6(_) => AddressFamily::Ipv6,
        }
    }
}

/// The address families the datapath serves on this node, as kube-proxy runs one
/// proxier per family: a Service is served in a family only through its cluster IP
/// of that family, so a family left out here leaves its addresses, endpoints and
/// maps entries out altogether ([`ServiceModel::restricted_to`]).
///
/// IPv4 only by default: the TC programs translate IPv4 packets only, so an IPv6
/// frontend would serve the node's own sockets and nothing else (issue 25).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ServedFamilies {
    pub ipv4: bool,
    pub ipv6: bool,
}

impl ServedFamilies {
    pub const IPV4_ONLY: Self = Self {
        ipv4: true,
        ipv6: false,
    };
    pub const DUAL_STACK: Self = Self {
        ipv4: true,
        ipv6: true,
    };

    pub fn contains(self, family: AddressFamily) -> bool {
        match family {
            AddressFamily::Ipv4 => self.ipv4,
            AddressFamily::Ipv6 => self.ipv6,
        }
    }

    /// Whether `address` is of a served family.
    pub fn serves(self, address: &IpAddr) -> bool {
        self.contains(AddressFamily::of(address))
    }
}

impl Default for ServedFamilies {
    fn default() -> Self {
        Self::IPV4_ONLY
    }
}

/// `externalTrafficPolicy` / `internalTrafficPolicy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum TrafficPolicy {
    /// Every endpoint of the cluster.
    #[default]
    Cluster,
    /// Only endpoints on this node.
    Local,
}

/// `targetPort` of a Service port. The datapath takes target ports from the
/// EndpointSlices (whose ports are already resolved per endpoint), so this is kept
/// for reporting only.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TargetPort {
    Number(u16),
    Name(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServicePortModel {
    /// Empty for a Service's single unnamed port.
    pub name: String,
    pub protocol: Protocol,
    pub port: u16,
    pub node_port: Option<u16>,
    pub target_port: TargetPort,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceModel {
    pub name: ServiceName,
    /// `spec.clusterIPs` (or `spec.clusterIP`), never empty.
    pub cluster_ips: Vec<IpAddr>,
    pub external_ips: Vec<IpAddr>,
    /// `status.loadBalancer.ingress[].ip` of a LoadBalancer Service.
    pub load_balancer_ips: Vec<IpAddr>,
    pub ports: Vec<ServicePortModel>,
    pub external_traffic_policy: TrafficPolicy,
    pub internal_traffic_policy: TrafficPolicy,
    /// `Some(timeout)` for `sessionAffinity: ClientIP`.
    pub session_affinity_timeout_seconds: Option<u32>,
    /// `spec.loadBalancerSourceRanges` of a LoadBalancer Service, the entries that
    /// parse ([`source_ranges::source_ranges`]); empty for every other type.
    pub load_balancer_source_ranges: Vec<source_ranges::Cidr>,
}

impl ServiceModel {
    /// Address families the Service serves (those of its cluster IPs).
    pub fn families(&self) -> Vec<AddressFamily> {
        let mut families: Vec<AddressFamily> =
            self.cluster_ips.iter().map(AddressFamily::of).collect();
        families.sort();
        families.dedup();
        families
    }

    /// The Service as the proxiers of the `served` families see it: only its
    /// addresses of those families (kube-proxy's per-family proxier skips a
    /// Service without a cluster IP of its family, and takes external and
    /// load-balancer addresses of its family only). `None` when no cluster IP is
    /// left: no family of the Service is served. A Service whose addresses are
    /// all served is returned unchanged.
    pub fn restricted_to(&self, served: ServedFamilies) -> Option<ServiceModel> {
        let all_served = |addresses: &[IpAddr]| addresses.iter().all(|ip| served.serves(ip));
        if all_served(&self.cluster_ips)
            && all_served(&self.external_ips)
            && all_served(&self.load_balancer_ips)
        {
            return Some(self.clone());
        }
        let keep = |addresses: &[IpAddr]| -> Vec<IpAddr> {
            addresses
                .iter()
                .copied()
                .filter(|ip| served.serves(ip))
                .collect()
        };
        let cluster_ips = keep(&self.cluster_ips);
        if cluster_ips.is_empty() {
            return None;
        }
        Some(ServiceModel {
            cluster_ips,
            external_ips: keep(&self.external_ips),
            load_balancer_ips: keep(&self.load_balancer_ips),
            ..self.clone()
        })
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointPortModel {
    pub name: String,
    pub protocol: Protocol,
    pub port: u16,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointModel {
    pub address: IpAddr,
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
    /// `nodeName`, or the `kubernetes.io/hostname` topology of older slices.
    pub node_name: Option<String>,
    /// `hints`: the zones and nodes the EndpointSlice controller meant the
    /// endpoint for (empty: no hint).
    pub hints: TopologyHints,
}

/// An endpoint's `hints.forZones[].name` and `hints.forNodes[].name`, sorted,
/// without duplicates or empty names. Boxed slices: most endpoints have none,
/// and an endpoint is kept for every pod of the cluster.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TopologyHints {
    pub zones: Box<[String]>,
    pub nodes: Box<[String]>,
}

impl TopologyHints {
    fn from_names<'a>(names: impl Iterator<Item = &'a str>) -> Box<[String]> {
        let mut names: Vec<String> = names
            .filter(|name| !name.is_empty())
            .map(str::to_string)
            .collect();
        names.sort();
        names.dedup();
        names.into_boxed_slice()
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointSliceModel {
    /// Namespace and name of the slice itself.
    pub slice_name: ServiceName,
    pub service: ServiceName,
    pub family: AddressFamily,
    pub ports: Vec<EndpointPortModel>,
    pub endpoints: Vec<EndpointModel>,
    /// [`LAST_CHANGE_TRIGGER_TIME_ANNOTATION`], when set and valid: where kube-proxy's
    /// `network_programming_duration_seconds` starts.
    pub last_change_trigger_time: Option<SystemTime>,
}

/// A slice's [`LAST_CHANGE_TRIGGER_TIME_ANNOTATION`]. Missing or not RFC 3339: `None`,
/// which kube-proxy's `getLastChangeTriggerTime` reads as the zero time it ignores.
pub fn last_change_trigger_time(metadata: &ObjectMeta) -> Option<SystemTime> {
    let text = metadata
        .annotations
        .as_ref()?
        .get(LAST_CHANGE_TRIGGER_TIME_ANNOTATION)?;
    let timestamp = text.parse::<k8s_openapi::jiff::Timestamp>().ok()?;
    // Before 1970 is no trigger time either: kube-proxy measures only triggers after its start.
    let seconds = u64::try_from(timestamp.as_second()).ok()?;
    let nanoseconds = u32::try_from(timestamp.subsec_nanosecond()).ok()?;
    SystemTime::UNIX_EPOCH.checked_add(std::time::Duration::new(seconds, nanoseconds))
}

fn required_name(metadata: &ObjectMeta) -> Result<ServiceName, FieldError> {
    let name = metadata
        .name
        .as_deref()
        .filter(|name| !name.is_empty())
        .ok_or_else(|| FieldError::new("metadata.name", "is missing"))?;
    // Manifests applied without a namespace land in `default`, as with kubectl.
    let namespace = metadata
        .namespace
        .as_deref()
        .filter(|namespace| !namespace.is_empty())
        .unwrap_or("default");
    Ok(ServiceName::new(namespace, name))
}

fn parse_address(field: String, text: &str) -> Result<IpAddr, FieldError> {
    text.trim()
        .parse()
        .map_err(|_| FieldError::new(field, format!("{text:?} is not an IP address")))
}

fn parse_port(field: String, value: i32) -> Result<u16, FieldError> {
    u16::try_from(value)
        .ok()
        .filter(|port| *port != 0)
        .ok_or_else(|| FieldError::new(field, format!("{value} is not a port number (1-65535)")))
}

/// `None` for SCTP (skipped), an error for anything else unknown.
fn parse_protocol(field: String, protocol: Option<&str>) -> Result<Option<Protocol>, FieldError> {
    match protocol.unwrap_or("TCP") {
        "TCP" => Ok(Some(Protocol::Tcp)),
        "UDP" => Ok(Some(Protocol::Udp)),
        "SCTP" => Ok(None),
        other => Err(FieldError::new(
            field,
            format!("{other:?} is not a protocol (TCP, UDP or SCTP)"),
        )),
    }
}

fn parse_traffic_policy(field: &str, policy: Option<&str>) -> Result<TrafficPolicy, FieldError> {
    match policy {
        None | Some("") | Some("Cluster") => Ok(TrafficPolicy::Cluster),
        Some("Local") => Ok(TrafficPolicy::Local),
        Some(other) => Err(FieldError::new(
            field,
            format!("{other:?} is not a traffic policy (Cluster or Local)"),
        )),
    }
}

/// A `v1` Service in the model; `Ok(None)` for Services the datapath does not
/// implement (ExternalName, headless, no cluster IP yet).
pub fn service_from_v1(service: &Service) -> Result<Option<ServiceModel>, FieldError> {
    let name = required_name(&service.metadata)?;
    if labels::hidden_from_kube_proxy(&service.metadata) {
        return Ok(None);
    }
    let Some(spec) = service.spec.as_ref() else {
        return Ok(None);
    };
    let service_type = spec.type_.as_deref().unwrap_or("ClusterIP");
    if service_type == "ExternalName" {
        return Ok(None);
    }
    let cluster_ip_texts: Vec<(String, &str)> = match spec.cluster_ips.as_ref() {
        Some(cluster_ips) if !cluster_ips.is_empty() => cluster_ips
            .iter()
            .enumerate()
            .map(|(index, ip)| (format!("spec.clusterIPs[{index}]"), ip.as_str()))
            .collect(),
        _ => spec
            .cluster_ip
            .iter()
            .map(|ip| ("spec.clusterIP".to_string(), ip.as_str()))
            .collect(),
    };
    if cluster_ip_texts
        .iter()
        .any(|(_, text)| text.is_empty() || *text == "None")
        || cluster_ip_texts.is_empty()
    {
        return Ok(None);
    }
    let cluster_ips = cluster_ip_texts
        .into_iter()
        .map(|(field, text)| parse_address(field, text))
        .collect::<Result<Vec<_>, _>>()?;

    let exposes_node_ports = matches!(service_type, "NodePort" | "LoadBalancer");
    let mut ports = Vec::new();
    for (index, port) in spec.ports.iter().flatten().enumerate() {
        let field = |name: &str| format!("spec.ports[{index}].{name}");
        let Some(protocol) = parse_protocol(field("protocol"), port.protocol.as_deref())? else {
            continue;
        };
        let number = parse_port(field("port"), port.port)?;
        let node_port = match port.node_port {
            Some(node_port) if exposes_node_ports && node_port != 0 => {
                Some(parse_port(field("nodePort"), node_port)?)
            }
            _ => None,
        };
        let target_port = match port.target_port.as_ref() {
            None => TargetPort::Number(number),
            Some(IntOrString::Int(target)) => {
                TargetPort::Number(parse_port(field("targetPort"), *target)?)
            }
            Some(IntOrString::String(target)) => match target.parse::<i32>() {
                Ok(target) => TargetPort::Number(parse_port(field("targetPort"), target)?),
                Err(_) => TargetPort::Name(target.clone()),
            },
        };
        ports.push(ServicePortModel {
            name: port.name.clone().unwrap_or_default(),
            protocol,
            port: number,
            node_port,
            target_port,
        });
    }

    let external_ips = spec
        .external_ips
        .iter()
        .flatten()
        .enumerate()
        .map(|(index, ip)| parse_address(format!("spec.externalIPs[{index}]"), ip))
        .collect::<Result<Vec<_>, _>>()?;

    let mut load_balancer_ips = Vec::new();
    if service_type == "LoadBalancer" {
        let ingresses = service
            .status
            .as_ref()
            .and_then(|status| status.load_balancer.as_ref())
            .and_then(|load_balancer| load_balancer.ingress.as_ref());
        for (index, ingress) in ingresses.into_iter().flatten().enumerate() {
            if ingress.ip_mode.as_deref() == Some("Proxy") {
                continue;
            }
            if let Some(ip) = ingress.ip.as_deref().filter(|ip| !ip.is_empty()) {
                load_balancer_ips.push(parse_address(
                    format!("status.loadBalancer.ingress[{index}].ip"),
                    ip,
                )?);
            }
        }
    }

    let session_affinity_timeout_seconds = match spec.session_affinity.as_deref() {
        None | Some("") | Some("None") => None,
        Some("ClientIP") => {
            let configured = spec
                .session_affinity_config
                .as_ref()
                .and_then(|config| config.client_ip.as_ref())
                .and_then(|client_ip| client_ip.timeout_seconds);
            Some(match configured {
                None => DEFAULT_AFFINITY_TIMEOUT_SECONDS,
                Some(seconds) => u32::try_from(seconds)
                    .ok()
                    .filter(|seconds| (1..=MAX_AFFINITY_TIMEOUT_SECONDS).contains(seconds))
                    .ok_or_else(|| {
                        FieldError::new(
                            "spec.sessionAffinityConfig.clientIP.timeoutSeconds",
                            format!(
                                "{seconds} is not between 1 and {MAX_AFFINITY_TIMEOUT_SECONDS}"
                            ),
                        )
                    })?,
            })
        }
        Some(other) => {
            return Err(FieldError::new(
                "spec.sessionAffinity",
                format!("{other:?} is not a session affinity (None or ClientIP)"),
            ))
        }
    };

    // Read only where load-balancer frontends exist: the ranges filter nothing else.
    let load_balancer_source_ranges =
        match (service_type, spec.load_balancer_source_ranges.as_ref()) {
            ("LoadBalancer", Some(texts)) => source_ranges::source_ranges(&name, texts),
            _ => Vec::new(),
        };

    Ok(Some(ServiceModel {
        name,
        cluster_ips,
        external_ips,
        load_balancer_ips,
        ports,
        external_traffic_policy: parse_traffic_policy(
            "spec.externalTrafficPolicy",
            spec.external_traffic_policy.as_deref(),
        )?,
        internal_traffic_policy: parse_traffic_policy(
            "spec.internalTrafficPolicy",
            spec.internal_traffic_policy.as_deref(),
        )?,
        session_affinity_timeout_seconds,
        load_balancer_source_ranges,
    }))
}

/// The parts of an EndpointSlice endpoint that both API versions share.
pub(crate) struct EndpointFields<'a> {
    pub addresses: &'a [String],
    pub ready: Option<bool>,
    pub serving: Option<bool>,
    pub terminating: Option<bool>,
    pub node_name: Option<&'a str>,
    pub topology: Option<&'a BTreeMap<String, String>>,
    pub zone_hints: Vec<&'a str>,
    pub node_hints: Vec<&'a str>,
}

/// The parts of an EndpointSlice port that both API versions share.
pub(crate) struct EndpointPortFields<'a> {
    pub name: Option<&'a str>,
    pub protocol: Option<&'a str>,
    pub port: Option<i32>,
}

/// The names in one list of an endpoint's hints (`forZones` or `forNodes`).
pub(crate) fn hint_names<'a, T>(
    hints: Option<&'a Vec<T>>,
    name: impl Fn(&'a T) -> &'a str,
) -> Vec<&'a str> {
    hints.into_iter().flatten().map(name).collect()
}

/// Shared by the v1 and v1beta1 conversions: `Ok(None)` for slices the datapath
/// does not use (FQDN addresses, no Service label, hidden from kube-proxy).
pub(crate) fn endpoint_slice_from_fields<'a>(
    metadata: &ObjectMeta,
    address_type: &str,
    ports: impl Iterator<Item = EndpointPortFields<'a>>,
    endpoints: impl Iterator<Item = EndpointFields<'a>>,
) -> Result<Option<EndpointSliceModel>, FieldError> {
    let slice_name = required_name(metadata)?;
    if labels::hidden_from_kube_proxy(metadata) {
        return Ok(None);
    }
    let Some(service_name) = metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(SERVICE_NAME_LABEL))
        .filter(|name| !name.is_empty())
    else {
        return Ok(None);
    };
    let family = match address_type {
        "IPv4" => AddressFamily::Ipv4,
        "IPv6" => AddressFamily::Ipv6,
        "FQDN" => return Ok(None),
        other => {
            return Err(FieldError::new(
                "addressType",
                format!("{other:?} is not an address type (IPv4, IPv6 or FQDN)"),
            ))
        }
    };
    let mut port_models = Vec::new();
    for (index, port) in ports.enumerate() {
        let Some(protocol) = parse_protocol(format!("ports[{index}].protocol"), port.protocol)?
        else {
            continue;
        };
        // A port without a number means "all ports" for selector-less slices,
        // which kube-proxy does not implement either.
        let Some(number) = port.port else { continue };
        port_models.push(EndpointPortModel {
            name: port.name.unwrap_or_default().to_string(),
            protocol,
            port: parse_port(format!("ports[{index}].port"), number)?,
        });
    }
    let mut endpoint_models = Vec::new();
    for (index, endpoint) in endpoints.enumerate() {
        let Some(first_address) = endpoint.addresses.first() else {
            continue;
        };
        let address = parse_address(format!("endpoints[{index}].addresses[0]"), first_address)?;
        if AddressFamily::of(&address) != family {
            return Err(FieldError::new(
                format!("endpoints[{index}].addresses[0]"),
                format!("{first_address} is not of the slice's addressType {address_type}"),
            ));
        }
        let ready = endpoint.ready.unwrap_or(true);
        let node_name = endpoint
            .node_name
            .filter(|name| !name.is_empty())
            .or_else(|| {
                endpoint
                    .topology
                    .and_then(|topology| topology.get(HOSTNAME_TOPOLOGY_KEY))
                    .map(String::as_str)
            })
            .map(str::to_string);
        endpoint_models.push(EndpointModel {
            address,
            ready,
            serving: endpoint.serving.unwrap_or(ready),
            terminating: endpoint.terminating.unwrap_or(false),
            node_name,
            hints: TopologyHints {
                zones: TopologyHints::from_names(endpoint.zone_hints.into_iter()),
                nodes: TopologyHints::from_names(endpoint.node_hints.into_iter()),
            },
        });
    }
    Ok(Some(EndpointSliceModel {
        service: ServiceName::new(slice_name.namespace.clone(), service_name.clone()),
        slice_name,
        family,
        ports: port_models,
        endpoints: endpoint_models,
        last_change_trigger_time: last_change_trigger_time(metadata),
    }))
}

/// An EndpointSlice of either API version read through
/// [`endpoint_slice_from_fields`]: their types differ, their fields have the
/// same names (v1beta1's hints included), save the topology (`topology_field`).
macro_rules! endpoint_slice_fields {
    ($slice:expr, $topology_field:ident) => {
        endpoint_slice_from_fields(
            &$slice.metadata,
            &$slice.address_type,
            $slice
                .ports
                .iter()
                .flatten()
                .map(|port| EndpointPortFields {
                    name: port.name.as_deref(),
                    protocol: port.protocol.as_deref(),
                    port: port.port,
                }),
            $slice.endpoints.iter().map(|endpoint| {
                let conditions = endpoint.conditions.as_ref();
                let hints = endpoint.hints.as_ref();
                EndpointFields {
                    addresses: &endpoint.addresses,
                    ready: conditions.and_then(|conditions| conditions.ready),
                    serving: conditions.and_then(|conditions| conditions.serving),
                    terminating: conditions.and_then(|conditions| conditions.terminating),
                    node_name: endpoint.node_name.as_deref(),
                    topology: endpoint.$topology_field.as_ref(),
                    zone_hints: $crate::model::hint_names(
                        hints.and_then(|hints| hints.for_zones.as_ref()),
                        |zone| zone.name.as_str(),
                    ),
                    node_hints: $crate::model::hint_names(
                        hints.and_then(|hints| hints.for_nodes.as_ref()),
                        |node| node.name.as_str(),
                    ),
                }
            }),
        )
    };
}
pub(crate) use endpoint_slice_fields;

/// A `discovery.k8s.io/v1` EndpointSlice in the model; `Ok(None)` for slices the
/// datapath does not use.
pub fn endpoint_slice_from_v1(
    slice: &EndpointSlice,
) -> Result<Option<EndpointSliceModel>, FieldError> {
    endpoint_slice_fields!(slice, deprecated_topology)
}

#[cfg(test)]
mod tests;
