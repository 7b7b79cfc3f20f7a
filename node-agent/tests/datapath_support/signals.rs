//! What the disruption tests share: the reports the standalone agent publishes in its log,
//! and a fragment sent without its first.

use std::net::Ipv4Addr;
use std::time::Duration;

use switchyard_crds::{DisruptionReport, SignalWindow};

use super::{agent_log, in_namespace, wait_until, Node, CLIENT_IP};

/// The reports the agent published so far, oldest first (each log line "disruption signals"
/// carries one as JSON).
pub fn published_reports(node: &Node) -> Vec<DisruptionReport> {
    agent_log(node)
        .lines()
        .filter(|line| line.contains("disruption signals"))
        .filter_map(|line| {
            let json = &line[line.find("report=")? + "report=".len()..];
            Some(serde_json::from_str(json.trim()).expect("a report in JSON"))
        })
        .collect()
}

/// Waits for a published report whose current window satisfies `wanted`, and returns it.
pub fn wait_for_window(
    node: &Node,
    deadline: Duration,
    what: &str,
    mut wanted: impl FnMut(&SignalWindow) -> bool,
) -> SignalWindow {
    let mut found = None;
    let reported = wait_until(deadline, || {
        found = published_reports(node)
            .into_iter()
            .filter_map(|report| report.current)
            .find(&mut wanted);
        found.is_some()
    });
    assert!(
        reported,
        "no report {what}; published: {:#?}\n{}",
        published_reports(node),
        agent_log(node)
    );
    found.expect("found")
}

/// Sends, from the client, one IPv4 fragment that is not a first (offset 1480 bytes, the last
/// of its datagram) of a UDP datagram to `destination`, whose first fragment is never sent.
pub fn send_a_later_fragment_alone(destination: Ipv4Addr) {
    in_namespace(Some("client"), move || {
        // SAFETY: a raw socket owned by this closure, closed at its end; the packet buffer
        // outlives the call that reads it.
        unsafe {
            let descriptor = libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_RAW);
            assert!(
                descriptor >= 0,
                "raw socket: {}",
                std::io::Error::last_os_error()
            );
            let mut packet = [0u8; 20 + 64];
            packet[0] = 0x45;
            let total_length = (packet.len() as u16).to_be_bytes();
            packet[2..4].copy_from_slice(&total_length);
            packet[4..6].copy_from_slice(&0x5a5au16.to_be_bytes());
            // No "more fragments", offset 1480 / 8.
            packet[6..8].copy_from_slice(&185u16.to_be_bytes());
            packet[8] = 64;
            packet[9] = libc::IPPROTO_UDP as u8;
            packet[12..16].copy_from_slice(&CLIENT_IP.octets());
            packet[16..20].copy_from_slice(&destination.octets());
            // The kernel fills the header checksum of IPPROTO_RAW packets.
            let address = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: 0,
                sin_addr: libc::in_addr {
                    s_addr: u32::from(destination).to_be(),
                },
                sin_zero: [0; 8],
            };
            let sent = libc::sendto(
                descriptor,
                packet.as_ptr().cast(),
                packet.len(),
                0,
                (&address as *const libc::sockaddr_in).cast(),
                std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
            );
            let error = std::io::Error::last_os_error();
            libc::close(descriptor);
            assert_eq!(sent, packet.len() as isize, "send the fragment: {error}");
        }
    })
    .join()
    .expect("client thread");
}
