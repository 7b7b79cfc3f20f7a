//! Whose chain is it? The cleanup removes kube-proxy's Service chains and nothing
//! else: kubelet's chains stay (kubelet recreates and relies on them), and so does
//! every chain of another agent (a CNI, kube-router, Docker).

/// Chains kube-proxy's iptables mode creates, by exact name.
pub const KUBE_PROXY_CHAINS: [&str; 7] = [
    "KUBE-SERVICES",
    "KUBE-NODEPORTS",
    "KUBE-EXTERNAL-SERVICES",
    "KUBE-FORWARD",
    "KUBE-PROXY-FIREWALL",
    "KUBE-POSTROUTING",
    "KUBE-PROXY-CANARY",
];

/// Per-Service chains of kube-proxy's iptables mode, by prefix: services and
/// their local views (`SVC`, `SVL`), external entry points (`EXT`), endpoints
/// (`SEP`), load-balancer firewalls (`FW`) and, before 1.24, external-local
/// (`XLB`).
pub const KUBE_PROXY_CHAIN_PREFIXES: [&str; 6] = [
    "KUBE-SVC-",
    "KUBE-SVL-",
    "KUBE-EXT-",
    "KUBE-SEP-",
    "KUBE-FW-",
    "KUBE-XLB-",
];

/// Chains kubelet owns (or co-owns with kube-proxy, such as `KUBE-MARK-MASQ` on
/// 1.20, which both create): never touched. `KUBE-IPTABLES-HINT` tells tools
/// which backend kubelet uses.
pub const KUBELET_CHAINS: [&str; 3] =
    ["KUBE-FIREWALL", "KUBE-KUBELET-CANARY", "KUBE-IPTABLES-HINT"];
pub const KUBELET_CHAIN_PREFIXES: [&str; 1] = ["KUBE-MARK-"];

/// `KUBE-POSTROUTING` is kube-proxy's today, but kubelet up to 1.22 creates it too
/// (with the jump from POSTROUTING) and puts it back every minute, so its return
/// does not mean kube-proxy is running: it is removed by the cleanup but never
/// counted as a kube-proxy rule.
pub const SHARED_WITH_OLD_KUBELETS: &str = "KUBE-POSTROUTING";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChainOwner {
    KubeProxy,
    Kubelet,
    /// Built-in chains, the agent's own and every other agent's.
    Other,
}

pub fn chain_owner(chain: &str) -> ChainOwner {
    if KUBE_PROXY_CHAINS.contains(&chain)
        || KUBE_PROXY_CHAIN_PREFIXES
            .iter()
            .any(|prefix| chain.starts_with(prefix) && chain.len() > prefix.len())
    {
        ChainOwner::KubeProxy
    } else if KUBELET_CHAINS.contains(&chain)
        || KUBELET_CHAIN_PREFIXES
            .iter()
            .any(|prefix| chain.starts_with(prefix))
    {
        ChainOwner::Kubelet
    } else {
        ChainOwner::Other
    }
}

pub fn is_kube_proxy_chain(chain: &str) -> bool {
    chain_owner(chain) == ChainOwner::KubeProxy
}

/// A kube-proxy chain whose presence proves kube-proxy (not kubelet) wrote it.
pub fn proves_kube_proxy(chain: &str) -> bool {
    is_kube_proxy_chain(chain) && chain != SHARED_WITH_OLD_KUBELETS
}
