//! `spec.loadBalancerSourceRanges`, read as kube-proxy reads it (`newBaseServiceInfo`
//! and `MapCIDRsByIPFamily`, kubernetes#94107):
//! - only the field, never the cloud annotation
//!   `service.beta.kubernetes.io/load-balancer-source-ranges` (cloud providers read
//!   that one, kube-proxy does not);
//! - each entry trimmed of spaces;
//! - parsed sloppily, as Go's legacy parsers do: an IPv4 octet with leading zeros
//!   is decimal (`010.0.0.0/8` is 10.0.0.0/8), which API validation let through
//!   before Kubernetes 1.33 and which stored objects may still hold;
//! - an entry that still does not parse is skipped with a warning and never
//!   blocks the rest (a list whose every entry is skipped filters nothing, as in
//!   kube-proxy);
//! - host bits are cleared (`10.0.0.1/8` is 10.0.0.0/8, as Go's `ParseCIDR`).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr};

use super::{AddressFamily, ServiceName};

/// One range of `spec.loadBalancerSourceRanges`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cidr {
    /// The range's first address: bits past `prefix_length` are zero.
    pub address: IpAddr,
    /// At most 32 for IPv4, 128 for IPv6.
    pub prefix_length: u8,
}

impl Cidr {
    pub fn family(&self) -> AddressFamily {
        AddressFamily::of(&self.address)
    }

    /// Whether this range is the whole address space of its family
    /// (`0.0.0.0/0`, `::/0`): kube-proxy then filters nothing for that family.
    pub fn is_everything(&self) -> bool {
        self.prefix_length == 0
    }

    /// Whether `address` lies in this range (never across families).
    pub fn contains(&self, address: &IpAddr) -> bool {
        match (self.address, address) {
            (IpAddr::V4(network), IpAddr::V4(address)) => {
                let mask = prefix_mask(self.prefix_length, 32);
                u128::from(u32::from(*address)) & mask == u128::from(u32::from(network))
            }
            (IpAddr::V6(network), IpAddr::V6(address)) => {
                u128::from(*address) & prefix_mask(self.prefix_length, 128) == u128::from(network)
            }
            _ => false,
        }
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "{}/{}", self.address, self.prefix_length)
    }
}

/// The mask of the first `length` bits of a `width`-bit address, in a `u128`.
fn prefix_mask(length: u8, width: u8) -> u128 {
    let full: u128 = if width == 128 {
        u128::MAX
    } else {
        (1u128 << width) - 1
    };
    if length == 0 {
        0
    } else {
        full & !((1u128 << (width - length.min(width))) - 1)
    }
}

/// An IPv4 address in dotted decimal, each octet decimal even with leading zeros
/// (Go's legacy `ParseIP`, k8s.io/utils' `ParseIPSloppy`).
fn parse_ipv4_sloppy(text: &str) -> Option<Ipv4Addr> {
    let mut octets = [0u8; 4];
    let mut fields = text.split('.');
    for octet in &mut octets {
        let field = fields.next()?;
        if field.is_empty() || field.len() > 3 || !field.bytes().all(|byte| byte.is_ascii_digit()) {
            return None;
        }
        *octet = field.parse().ok()?;
    }
    fields.next().is_none().then_some(Ipv4Addr::from(octets))
}

/// One entry of `spec.loadBalancerSourceRanges`, trimmed and parsed sloppily;
/// `None` if it is no CIDR even so.
pub fn parse_cidr(text: &str) -> Option<Cidr> {
    let (address, length) = text.trim().split_once('/')?;
    if length.is_empty() || !length.bytes().all(|byte| byte.is_ascii_digit()) {
        return None;
    }
    let length: u8 = length.parse().ok()?;
    let address = match parse_ipv4_sloppy(address) {
        Some(ipv4) => IpAddr::V4(ipv4),
        None => IpAddr::V6(address.parse().ok()?),
    };
    let (network, width) = match address {
        IpAddr::V4(ipv4) => (u128::from(u32::from(ipv4)), 32),
        IpAddr::V6(ipv6) => (u128::from(ipv6), 128),
    };
    if length > width {
        return None;
    }
    let network = network & prefix_mask(length, width);
    let address = match address {
        // The mask keeps an IPv4 network within 32 bits.
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::from(u32::try_from(network).ok()?)),
        IpAddr::V6(_) => IpAddr::V6(network.into()),
    };
    Some(Cidr {
        address,
        prefix_length: length,
    })
}

/// The ranges of `spec.loadBalancerSourceRanges` of `service` that parse; each one
/// that does not is logged and skipped, as kube-proxy does.
pub fn source_ranges(service: &ServiceName, texts: &[String]) -> Vec<Cidr> {
    let mut ranges = Vec::with_capacity(texts.len());
    for (index, text) in texts.iter().enumerate() {
        match parse_cidr(text) {
            Some(range) => ranges.push(range),
            None => tracing::warn!(
                service = %service,
                field = %format!("spec.loadBalancerSourceRanges[{index}]"),
                value = %text,
                "a load-balancer source range is not a CIDR: it is ignored, the others still filter"
            ),
        }
    }
    ranges.sort();
    ranges.dedup();
    ranges
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cidr(text: &str) -> Cidr {
        parse_cidr(text).unwrap_or_else(|| panic!("{text:?} parses"))
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().expect("test address")
    }

    #[test]
    fn a_range_is_trimmed_of_spaces_before_it_is_parsed() {
        assert_eq!(cidr(" 192.168.1.0/24 "), cidr("192.168.1.0/24"));
        assert_eq!(cidr("\t10.0.0.0/8\n").to_string(), "10.0.0.0/8");
    }

    #[test]
    fn ipv4_octets_with_leading_zeros_are_read_as_decimal_as_kube_proxy_reads_them() {
        assert_eq!(cidr("010.000.001.000/24").to_string(), "10.0.1.0/24");
    }

    #[test]
    fn host_bits_of_a_range_are_cleared() {
        assert_eq!(cidr("10.1.2.3/8").to_string(), "10.0.0.0/8");
        assert_eq!(cidr("fd00::1/64").to_string(), "fd00::/64");
        assert_eq!(cidr("10.1.2.3/32").to_string(), "10.1.2.3/32");
    }

    #[test]
    fn text_that_is_no_cidr_does_not_parse() {
        for text in [
            "",
            "10.0.0.0",
            "10.0.0.0/",
            "10.0.0.0/33",
            "10.0.0.0/-1",
            "10.0.0/8",
            "10.0.0.0.0/8",
            "1000.0.0.0/8",
            "10.0.0.x/8",
            "fd00::/129",
            "any",
        ] {
            assert_eq!(parse_cidr(text), None, "{text:?}");
        }
    }

    #[test]
    fn a_range_contains_the_addresses_of_its_prefix_and_of_its_family_only() {
        let range = cidr("192.168.60.0/24");
        assert!(range.contains(&ip("192.168.60.0")));
        assert!(range.contains(&ip("192.168.60.255")));
        assert!(!range.contains(&ip("192.168.61.1")));
        assert!(!range.contains(&ip("::ffff:192.168.60.1")));
        assert!(cidr("0.0.0.0/0").contains(&ip("8.8.8.8")));
        assert!(cidr("0.0.0.0/0").is_everything());
        assert!(!cidr("0.0.0.0/1").is_everything());
        assert!(cidr("fd00::/8").contains(&ip("fdff::1")));
        assert!(!cidr("fd00::/8").contains(&ip("fe00::1")));
    }

    #[test]
    fn an_invalid_range_is_skipped_and_the_others_are_kept_sorted_without_duplicates() {
        let texts = [
            "10.0.0.0/8".to_string(),
            "not a cidr".to_string(),
            " 192.168.1.0/24".to_string(),
            "10.0.0.0/8".to_string(),
        ];
        let ranges = source_ranges(&ServiceName::new("default", "web"), &texts);
        assert_eq!(ranges, vec![cidr("10.0.0.0/8"), cidr("192.168.1.0/24")]);
    }
}
