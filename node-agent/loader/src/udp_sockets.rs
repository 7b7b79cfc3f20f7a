//! Aborting the node's UDP sockets that the connect hook connected to a backend
//! that has since left their Service. Such a socket holds the backend itself (no
//! conntrack entry to delete, see `udp_flows`), so it would keep sending to it.
//! As Cilium does (its socket load balancer's termination of sockets to deleted
//! backends), the socket is destroyed: the kernel's UDP abort reports
//! ECONNABORTED to the application and disconnects the socket, which connects
//! again and is balanced to a live backend. Cilium uses a BPF socket iterator
//! calling `bpf_sock_destroy`; this uses the older interface to the same kernel
//! code (`SOCK_DESTROY` over `NETLINK_SOCK_DIAG`, `CONFIG_INET_DIAG_DESTROY`),
//! which needs no program.
//!
//! Only sockets the hook translated are touched: a socket is aborted only when
//! `SY_SOCK_REVERSE` holds (its cookie, its peer) with the frontend the backend
//! left. A socket an application connected to the pod address itself is left alone.

use std::collections::HashMap;
use std::os::fd::OwnedFd;

use switchyard_common::{ipv4_mapped, SocketReverseKey, SocketReverseValue};
use switchyard_model::diff::RemovedUdpBackends;

use crate::netlink;

/// `inet_diag_sockid`: ports and addresses in network byte order, as the kernel
/// gives them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UdpSocketId {
    pub source_port_big_endian: u16,
    pub destination_port_big_endian: u16,
    pub source: [u8; 4],
    pub destination: [u8; 4],
    pub interface: u32,
    pub cookie: u64,
}

const SOCK_DIAG_BY_FAMILY: u16 = 20;
const SOCK_DESTROY: u16 = 21;
// The netlink header's fields are 16 bits wide; libc gives their values as c_int.
const NLMSG_ERROR: u16 = libc::NLMSG_ERROR as u16;
const NLMSG_DONE: u16 = libc::NLMSG_DONE as u16;
const NLM_F_REQUEST: u16 = libc::NLM_F_REQUEST as u16;
const NLM_F_ACK: u16 = libc::NLM_F_ACK as u16;
const NLM_F_DUMP: u16 = libc::NLM_F_DUMP as u16;
const HEADER_LENGTH: usize = std::mem::size_of::<libc::nlmsghdr>();
/// `struct inet_diag_req_v2`.
const REQUEST_LENGTH: usize = 56;
/// `struct inet_diag_msg`.
const MESSAGE_LENGTH: usize = 72;
/// Connected UDP sockets are in the state `TCP_ESTABLISHED` (1).
const ESTABLISHED_ONLY: u32 = 1 << 1;

/// A `NETLINK_SOCK_DIAG` message about IPv4 UDP sockets: a dump of the
/// connected ones (`id` none), or the destruction of `id`.
pub fn request(sequence: u32, id: Option<&UdpSocketId>) -> Vec<u8> {
    let mut message = vec![0u8; HEADER_LENGTH + REQUEST_LENGTH];
    let length = message.len() as u32;
    message[0..4].copy_from_slice(&length.to_ne_bytes());
    let (kind, flags) = match id {
        None => (SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP),
        Some(_) => (SOCK_DESTROY, NLM_F_REQUEST | NLM_F_ACK),
    };
    message[4..6].copy_from_slice(&kind.to_ne_bytes());
    message[6..8].copy_from_slice(&flags.to_ne_bytes());
    message[8..12].copy_from_slice(&sequence.to_ne_bytes());
    let body = &mut message[HEADER_LENGTH..];
    body[0] = libc::AF_INET as u8;
    body[1] = libc::IPPROTO_UDP as u8;
    body[4..8].copy_from_slice(&ESTABLISHED_ONLY.to_ne_bytes());
    if let Some(id) = id {
        write_id(&mut body[8..56], id);
    }
    message
}

fn write_id(field: &mut [u8], id: &UdpSocketId) {
    field[0..2].copy_from_slice(&id.source_port_big_endian.to_ne_bytes());
    field[2..4].copy_from_slice(&id.destination_port_big_endian.to_ne_bytes());
    field[4..8].copy_from_slice(&id.source);
    field[20..24].copy_from_slice(&id.destination);
    field[36..40].copy_from_slice(&id.interface.to_ne_bytes());
    // The kernel splits the cookie into two 32-bit halves, low half first.
    field[40..44].copy_from_slice(&(id.cookie as u32).to_ne_bytes());
    field[44..48].copy_from_slice(&((id.cookie >> 32) as u32).to_ne_bytes());
}

fn read_id(field: &[u8]) -> Option<UdpSocketId> {
    let u16_at = |at: usize| Some(u16::from_ne_bytes(field.get(at..at + 2)?.try_into().ok()?));
    let u32_at = |at: usize| Some(u32::from_ne_bytes(field.get(at..at + 4)?.try_into().ok()?));
    let address_at = |at: usize| -> Option<[u8; 4]> { field.get(at..at + 4)?.try_into().ok() };
    Some(UdpSocketId {
        source_port_big_endian: u16_at(0)?,
        destination_port_big_endian: u16_at(2)?,
        source: address_at(4)?,
        destination: address_at(20)?,
        interface: u32_at(36)?,
        cookie: u64::from(u32_at(40)?) | (u64::from(u32_at(44)?) << 32),
    })
}

/// What one read of a dump's answer held.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Answer {
    pub sockets: Vec<UdpSocketId>,
    /// `NLMSG_DONE` or an acknowledgement came.
    pub done: bool,
    /// An `NLMSG_ERROR` with a non-zero error (negative errno, as the kernel sends it).
    pub error: Option<i32>,
}

/// Parses the netlink messages in `buffer`.
pub fn parse(buffer: &[u8]) -> Answer {
    let mut answer = Answer::default();
    let mut at = 0;
    while at + HEADER_LENGTH <= buffer.len() {
        let header = &buffer[at..at + HEADER_LENGTH];
        let length = u32::from_ne_bytes([header[0], header[1], header[2], header[3]]) as usize;
        let kind = u16::from_ne_bytes([header[4], header[5]]);
        if length < HEADER_LENGTH || at + length > buffer.len() {
            break;
        }
        let body = &buffer[at + HEADER_LENGTH..at + length];
        match kind {
            NLMSG_DONE => answer.done = true,
            NLMSG_ERROR => {
                answer.done = true;
                let code = body
                    .get(0..4)
                    .map(|bytes| i32::from_ne_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
                    .unwrap_or(-libc::EPROTO);
                if code != 0 {
                    answer.error = Some(code);
                }
            }
            SOCK_DIAG_BY_FAMILY if body.len() >= MESSAGE_LENGTH => {
                if let Some(id) = read_id(&body[4..52]) {
                    answer.sockets.push(id);
                }
            }
            _ => {}
        }
        // Messages are aligned to 4 bytes.
        at += (length + 3) & !3;
    }
    answer
}

/// The sockets of `sockets` that the connect hook connected (their reverse
/// entry: cookie and peer) through a frontend that `removed` says their peer left.
pub fn sockets_to_abort(
    sockets: &[UdpSocketId],
    translated: &HashMap<SocketReverseKey, SocketReverseValue>,
    removed: &RemovedUdpBackends,
) -> Vec<UdpSocketId> {
    sockets
        .iter()
        .filter(|socket| {
            let backend = (
                ipv4_mapped(socket.destination),
                socket.destination_port_big_endian,
            );
            let key = SocketReverseKey {
                socket_cookie: socket.cookie,
                backend_address: backend.0,
                backend_port_big_endian: backend.1,
                reserved: [0; 6],
            };
            translated.get(&key).is_some_and(|frontend| {
                removed.contains(
                    &(frontend.frontend_address, frontend.frontend_port_big_endian),
                    &backend,
                )
            })
        })
        .copied()
        .collect()
}

/// A `NETLINK_SOCK_DIAG` socket of this process's network namespace (the node's,
/// for the agent: the one whose sockets the hook translates).
pub struct SockDiag {
    socket: OwnedFd,
    sequence: u32,
}

impl SockDiag {
    pub fn open() -> std::io::Result<Self> {
        Ok(Self {
            socket: netlink::open_socket(libc::NETLINK_SOCK_DIAG)?,
            sequence: 0,
        })
    }

    fn send(&mut self, id: Option<&UdpSocketId>) -> std::io::Result<()> {
        self.sequence = self.sequence.wrapping_add(1);
        netlink::send(&self.socket, &request(self.sequence, id))
    }

    /// Reads answers until the kernel says it is done.
    fn receive_all(&mut self) -> std::io::Result<Answer> {
        let mut all = Answer::default();
        let mut buffer = vec![0u8; 64 * 1024];
        while !all.done {
            let received = netlink::receive(&self.socket, &mut buffer, 0)?;
            if received == 0 {
                break;
            }
            let answer = parse(&buffer[..received]);
            all.sockets.extend(answer.sockets);
            all.done = answer.done;
            all.error = all.error.or(answer.error);
        }
        Ok(all)
    }

    /// The node's connected IPv4 UDP sockets.
    pub fn connected_udp_sockets(&mut self) -> std::io::Result<Vec<UdpSocketId>> {
        self.send(None)?;
        let answer = self.receive_all()?;
        if let Some(code) = answer.error {
            return Err(std::io::Error::from_raw_os_error(-code));
        }
        Ok(answer.sockets)
    }

    /// Aborts one socket; one closed meanwhile is not an error.
    pub fn abort(&mut self, id: &UdpSocketId) -> std::io::Result<()> {
        self.send(Some(id))?;
        match self.receive_all()?.error {
            None => Ok(()),
            Some(code) if -code == libc::ENOENT => Ok(()),
            Some(code) => Err(std::io::Error::from_raw_os_error(-code)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn socket(cookie: u64, destination: [u8; 4]) -> UdpSocketId {
        UdpSocketId {
            source_port_big_endian: 40_000u16.to_be(),
            destination_port_big_endian: 8053u16.to_be(),
            source: [192, 168, 50, 1],
            destination,
            interface: 0,
            cookie,
        }
    }

    fn translated(
        cookie: u64,
        backend: [u8; 4],
        frontend: [u8; 4],
    ) -> (SocketReverseKey, SocketReverseValue) {
        (
            SocketReverseKey {
                socket_cookie: cookie,
                backend_address: ipv4_mapped(backend),
                backend_port_big_endian: 8053u16.to_be(),
                reserved: [0; 6],
            },
            SocketReverseValue {
                frontend_address: ipv4_mapped(frontend),
                frontend_port_big_endian: 53u16.to_be(),
                reserved: 0,
            },
        )
    }

    fn removed(frontend: [u8; 4], backend: [u8; 4]) -> RemovedUdpBackends {
        let mut removed = RemovedUdpBackends::default();
        removed
            .by_frontend
            .entry((ipv4_mapped(frontend), 53u16.to_be()))
            .or_default()
            .insert((ipv4_mapped(backend), 8053u16.to_be()));
        removed
    }

    #[test]
    fn a_destroy_request_names_the_socket_as_the_dump_gave_it() {
        let id = socket(0x1234_5678_9abc_def0, [10, 244, 0, 11]);
        let message = request(7, Some(&id));
        assert_eq!(message.len(), HEADER_LENGTH + REQUEST_LENGTH);
        assert_eq!(u16::from_ne_bytes([message[4], message[5]]), SOCK_DESTROY);
        // A dump answer carrying the same id (family, state, timer, retrans first)
        // parses back to it.
        let mut answer = vec![0u8; HEADER_LENGTH + MESSAGE_LENGTH];
        answer[0..4].copy_from_slice(&((HEADER_LENGTH + MESSAGE_LENGTH) as u32).to_ne_bytes());
        answer[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
        answer[HEADER_LENGTH + 4..HEADER_LENGTH + 52]
            .copy_from_slice(&message[HEADER_LENGTH + 8..HEADER_LENGTH + 56]);
        assert_eq!(parse(&answer).sockets, vec![id]);
    }

    #[test]
    fn an_error_answer_is_reported_and_ends_the_read() {
        let mut answer = vec![0u8; HEADER_LENGTH + 4];
        answer[0..4].copy_from_slice(&((HEADER_LENGTH + 4) as u32).to_ne_bytes());
        answer[4..6].copy_from_slice(&NLMSG_ERROR.to_ne_bytes());
        answer[HEADER_LENGTH..].copy_from_slice(&(-libc::ENOENT).to_ne_bytes());
        let parsed = parse(&answer);
        assert!(parsed.done);
        assert_eq!(parsed.error, Some(-libc::ENOENT));
    }

    #[test]
    fn only_a_socket_the_hook_connected_through_the_frontend_the_backend_left_is_aborted() {
        let frontend = [10, 96, 0, 53];
        let gone = [10, 244, 0, 11];
        let kept = [10, 244, 0, 12];
        let translated: HashMap<_, _> = [
            translated(1, gone, frontend),
            translated(2, kept, frontend),
            translated(3, gone, [10, 96, 0, 54]),
        ]
        .into_iter()
        .collect();
        let sockets = [
            socket(1, gone),
            socket(2, kept),
            // Through another Service that keeps the backend.
            socket(3, gone),
            // Connected to the pod address by the application: no reverse entry.
            socket(4, gone),
        ];
        let chosen = sockets_to_abort(&sockets, &translated, &removed(frontend, gone));
        assert_eq!(chosen, vec![socket(1, gone)]);
    }
}
