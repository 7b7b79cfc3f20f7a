//! Which interfaces get which program, and the node's addresses.
//!
//! Pod interfaces (host side of pod veths) match `--pod-interfaces` (default
//! `veth*,cali*,lxc*`). Host interfaces match `--host-interfaces` if given, and
//! default to every other interface except loopback. The node's local addresses
//! (NodePorts are served on those `nodePortAddresses` selects) are the global
//! addresses of every interface, whatever program it gets: kube-proxy's
//! `--dst-type LOCAL` matches an address on a bridge or a pod interface too.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::process::Command;

use serde::Deserialize;

use crate::Error;

pub const DEFAULT_POD_INTERFACE_GLOBS: &str = "veth*,cali*,lxc*";

/// Comma-separated globs (`*` any run of characters, `?` one character).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Globs(Vec<String>);

impl Globs {
    pub fn parse(text: &str) -> Self {
        Self(
            text.split(',')
                .map(str::trim)
                .filter(|pattern| !pattern.is_empty())
                .map(str::to_string)
                .collect(),
        )
    }

    pub fn matches(&self, name: &str) -> bool {
        self.0.iter().any(|pattern| glob_matches(pattern, name))
    }
}

/// Shell-style match of `*` and `?` (no character classes: interface names do
/// not need them).
pub fn glob_matches(pattern: &str, name: &str) -> bool {
    let pattern: Vec<char> = pattern.chars().collect();
    let name: Vec<char> = name.chars().collect();
    let (mut pattern_index, mut name_index) = (0, 0);
    // Position after the last `*` and the name position it was tried at.
    let mut backtrack: Option<(usize, usize)> = None;
    while name_index < name.len() {
        match pattern.get(pattern_index) {
            Some('*') => {
                pattern_index += 1;
                backtrack = Some((pattern_index, name_index));
            }
            Some(&character) if character == '?' || character == name[name_index] => {
                pattern_index += 1;
                name_index += 1;
            }
            _ => match backtrack {
                Some((after_star, tried)) => {
                    pattern_index = after_star;
                    name_index = tried + 1;
                    backtrack = Some((after_star, tried + 1));
                }
                None => return false,
            },
        }
    }
    pattern[pattern_index..]
        .iter()
        .all(|character| *character == '*')
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum InterfaceRole {
    Pod,
    Host,
}

/// The role of an interface, or `None` if it gets no program.
pub fn role_of(name: &str, pod_globs: &Globs, host_globs: Option<&Globs>) -> Option<InterfaceRole> {
    if name == "lo" {
        return None;
    }
    if pod_globs.matches(name) {
        return Some(InterfaceRole::Pod);
    }
    match host_globs {
        Some(globs) if !globs.matches(name) => None,
        _ => Some(InterfaceRole::Host),
    }
}

/// One interface as `ip -j addr` reports it.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct IpInterface {
    pub ifindex: u32,
    pub ifname: String,
    #[serde(default)]
    pub addr_info: Vec<IpAddressInfo>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct IpAddressInfo {
    pub family: String,
    pub local: Option<String>,
    pub scope: Option<String>,
}

/// Interfaces and addresses of the current network namespace (`ip -j addr`).
pub fn read_interfaces() -> Result<Vec<IpInterface>, Error> {
    let output = Command::new("ip")
        .args(["-j", "addr", "show"])
        .output()
        .map_err(|error| Error::ReadInterfaces {
            source: Box::new(error),
        })?;
    if !output.status.success() {
        return Err(Error::ReadInterfaces {
            source: format!(
                "ip -j addr show: {}: {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            )
            .into(),
        });
    }
    parse_ip_json(&output.stdout)
}

pub fn parse_ip_json(json: &[u8]) -> Result<Vec<IpInterface>, Error> {
    serde_json::from_slice(json).map_err(|error| Error::ReadInterfaces {
        source: Box::new(error),
    })
}

/// Interfaces that get programs, by name.
pub fn interface_roles(
    interfaces: &[IpInterface],
    pod_globs: &Globs,
    host_globs: Option<&Globs>,
) -> BTreeMap<String, (u32, InterfaceRole)> {
    interfaces
        .iter()
        .filter_map(|interface| {
            role_of(&interface.ifname, pod_globs, host_globs)
                .map(|role| (interface.ifname.clone(), (interface.ifindex, role)))
        })
        .collect()
}

/// Global addresses of every interface, sorted: the node's local addresses.
/// Link-local ones are left out (every veth has its own IPv6 one), and so is
/// loopback (localhost NodePorts have their own setting).
pub fn local_addresses(interfaces: &[IpInterface]) -> Vec<IpAddr> {
    let mut addresses: Vec<IpAddr> = interfaces
        .iter()
        .flat_map(|interface| &interface.addr_info)
        .filter(|info| matches!(info.family.as_str(), "inet" | "inet6"))
        .filter(|info| info.scope.as_deref().unwrap_or("global") == "global")
        .filter_map(|info| info.local.as_deref()?.parse::<IpAddr>().ok())
        .filter(|address| !address.is_loopback())
        .collect();
    addresses.sort();
    addresses.dedup();
    addresses
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_stars_and_question_marks() {
        assert!(glob_matches("veth*", "veth12ab"));
        assert!(glob_matches("veth*", "veth"));
        assert!(!glob_matches("veth*", "eth0"));
        assert!(glob_matches("e?h*", "eth0"));
        assert!(glob_matches("*0", "eth0"));
        assert!(glob_matches("*a*b*", "xxaxxbxx"));
        assert!(!glob_matches("*a*b", "xxaxxbxc"));
        assert!(glob_matches("eth0", "eth0"));
        assert!(!glob_matches("eth0", "eth01"));
        assert!(glob_matches("*", ""));
    }

    #[test]
    fn pod_interfaces_come_first_and_host_interfaces_are_the_rest_but_loopback() {
        let pods = Globs::parse(DEFAULT_POD_INTERFACE_GLOBS);
        assert_eq!(role_of("veth1", &pods, None), Some(InterfaceRole::Pod));
        assert_eq!(role_of("cali123", &pods, None), Some(InterfaceRole::Pod));
        assert_eq!(role_of("lxc9", &pods, None), Some(InterfaceRole::Pod));
        assert_eq!(role_of("eth0", &pods, None), Some(InterfaceRole::Host));
        assert_eq!(role_of("lo", &pods, None), None);
        let hosts = Globs::parse("eth*, ens*");
        assert_eq!(
            role_of("ens3", &pods, Some(&hosts)),
            Some(InterfaceRole::Host)
        );
        assert_eq!(role_of("docker0", &pods, Some(&hosts)), None);
    }

    const IP_JSON: &str = r#"[
      {"ifindex":1,"ifname":"lo","addr_info":[{"family":"inet","local":"127.0.0.1","scope":"host"}]},
      {"ifindex":2,"ifname":"eth0","addr_info":[
        {"family":"inet","local":"192.168.1.10","scope":"global"},
        {"family":"inet6","local":"fe80::1","scope":"link"},
        {"family":"inet6","local":"fd00::10","scope":"global"}]},
      {"ifindex":3,"ifname":"veth0","addr_info":[{"family":"inet","local":"169.254.1.1","scope":"global"}]},
      {"ifindex":4,"ifname":"eth1","addr_info":[{"family":"inet","local":"172.16.0.10","scope":"global"}]}
    ]"#;

    #[test]
    fn local_addresses_are_the_global_addresses_of_every_interface_but_loopback() {
        let interfaces = parse_ip_json(IP_JSON.as_bytes()).expect("parses");
        let pods = Globs::parse(DEFAULT_POD_INTERFACE_GLOBS);
        let expected: Vec<IpAddr> = ["169.254.1.1", "172.16.0.10", "192.168.1.10", "fd00::10"]
            .iter()
            .map(|text| text.parse().expect("valid"))
            .collect();
        assert_eq!(local_addresses(&interfaces), expected);
        // 127.0.0.1 is left out whatever scope `ip` reports for it.
        let global_loopback = parse_ip_json(
            br#"[{"ifindex":1,"ifname":"lo","addr_info":[{"family":"inet","local":"127.0.0.1","scope":"global"}]}]"#,
        )
        .expect("parses");
        assert_eq!(local_addresses(&global_loopback), Vec::<IpAddr>::new());
        let roles = interface_roles(&interfaces, &pods, None);
        assert_eq!(
            roles.into_iter().collect::<Vec<_>>(),
            vec![
                ("eth0".to_string(), (2, InterfaceRole::Host)),
                ("eth1".to_string(), (4, InterfaceRole::Host)),
                ("veth0".to_string(), (3, InterfaceRole::Pod)),
            ]
        );
    }
}
