//! Netlink link notifications (`RTMGRP_LINK`): new pod interfaces get their
//! programs within a second of appearing, without polling.

use std::{
    io,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    time::Duration,
};

use crate::Error;

const RTM_NEWLINK: u16 = 16;
const RTM_DELLINK: u16 = 17;
const RTMGRP_LINK: u32 = 1;
const IFLA_IFNAME: u16 = 3;
const NLMSG_HEADER_LENGTH: usize = 16;
const IFINFOMSG_LENGTH: usize = 16;
const IFF_UP: u32 = 1;

/// A change of one network interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InterfaceEvent {
    /// An interface appeared or changed (up, renamed, ...).
    Changed {
        index: u32,
        name: String,
        up: bool,
    },
    Removed {
        index: u32,
        name: String,
    },
}

pub struct InterfaceWatcher {
    socket: OwnedFd,
}

fn watch_error(source: io::Error) -> Error {
    Error::WatchInterfaces { source }
}

impl InterfaceWatcher {
    /// Subscribes to link notifications of the calling thread's network namespace.
    pub fn new() -> Result<Self, Error> {
        // SAFETY: plain socket(2) call.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::NETLINK_ROUTE,
            )
        };
        if fd < 0 {
            return Err(watch_error(io::Error::last_os_error()));
        }
        // SAFETY: fd was just returned by socket(2).
        let socket = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: zeroed sockaddr_nl is a valid value; we fill family and groups.
        let mut address: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        address.nl_family = libc::AF_NETLINK as u16;
        address.nl_groups = RTMGRP_LINK;
        // SAFETY: valid socket and address of the length passed.
        let result = unsafe {
            libc::bind(
                socket.as_raw_fd(),
                (&address as *const libc::sockaddr_nl).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as u32,
            )
        };
        if result != 0 {
            return Err(watch_error(io::Error::last_os_error()));
        }
        Ok(Self { socket })
    }

    /// Waits up to `timeout` for notifications and returns those that arrived
    /// (empty on timeout). After an overrun (ENOBUFS) the caller should rescan
    /// every interface: it is reported as an error.
    pub fn wait(&self, timeout: Duration) -> Result<Vec<InterfaceEvent>, Error> {
        let mut poll = libc::pollfd {
            fd: self.socket.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let milliseconds = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd.
        let ready = unsafe { libc::poll(&mut poll, 1, milliseconds) };
        if ready < 0 {
            let error = io::Error::last_os_error();
            if error.kind() == io::ErrorKind::Interrupted {
                return Ok(Vec::new());
            }
            return Err(watch_error(error));
        }
        if ready == 0 {
            return Ok(Vec::new());
        }
        let mut buffer = vec![0u8; 64 * 1024];
        // SAFETY: valid socket and buffer of the length passed.
        let length = unsafe {
            libc::recv(
                self.socket.as_raw_fd(),
                buffer.as_mut_ptr().cast(),
                buffer.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if length < 0 {
            let error = io::Error::last_os_error();
            if error.kind() == io::ErrorKind::WouldBlock {
                return Ok(Vec::new());
            }
            return Err(watch_error(error));
        }
        Ok(parse_messages(&buffer[..length as usize]))
    }
}

fn read_u16(bytes: &[u8], offset: usize) -> Option<u16> {
    Some(u16::from_ne_bytes([
        *bytes.get(offset)?,
        *bytes.get(offset + 1)?,
    ]))
}

fn read_u32(bytes: &[u8], offset: usize) -> Option<u32> {
    let slice = bytes.get(offset..offset + 4)?;
    Some(u32::from_ne_bytes([slice[0], slice[1], slice[2], slice[3]]))
}

fn align4(length: usize) -> usize {
    (length + 3) & !3
}

/// Parses a buffer of netlink messages into link events, skipping anything else
/// or anything malformed.
pub(crate) fn parse_messages(buffer: &[u8]) -> Vec<InterfaceEvent> {
    let mut events = Vec::new();
    let mut offset = 0;
    while offset + NLMSG_HEADER_LENGTH <= buffer.len() {
        let Some(length) = read_u32(buffer, offset).map(|length| length as usize) else {
            break;
        };
        let Some(message_type) = read_u16(buffer, offset + 4) else {
            break;
        };
        if length < NLMSG_HEADER_LENGTH || offset + length > buffer.len() {
            break;
        }
        let message = &buffer[offset..offset + length];
        if message_type == RTM_NEWLINK || message_type == RTM_DELLINK {
            if let Some(event) = parse_link(message, message_type == RTM_DELLINK) {
                events.push(event);
            }
        }
        offset += align4(length);
    }
    events
}

fn parse_link(message: &[u8], removed: bool) -> Option<InterfaceEvent> {
    // struct ifinfomsg { u8 family; u8 pad; u16 type; i32 index; u32 flags; u32 change; }
    let info = NLMSG_HEADER_LENGTH;
    let index = read_u32(message, info + 4)?;
    let flags = read_u32(message, info + 8)?;
    let mut offset = info + IFINFOMSG_LENGTH;
    let mut name = None;
    while offset + 4 <= message.len() {
        let attribute_length = read_u16(message, offset)? as usize;
        let attribute_type = read_u16(message, offset + 2)?;
        if attribute_length < 4 || offset + attribute_length > message.len() {
            break;
        }
        if attribute_type == IFLA_IFNAME {
            let value = &message[offset + 4..offset + attribute_length];
            let value = value.split(|byte| *byte == 0).next().unwrap_or(value);
            name = Some(String::from_utf8_lossy(value).into_owned());
        }
        offset += align4(attribute_length);
    }
    let name = name?;
    Some(if removed {
        InterfaceEvent::Removed { index, name }
    } else {
        InterfaceEvent::Changed {
            index,
            name,
            up: flags & IFF_UP != 0,
        }
    })
}

/// Whether `name` matches a shell-style glob made of literal characters and `*`.
pub fn glob_matches(pattern: &str, name: &str) -> bool {
    let pattern = pattern.as_bytes();
    let name = name.as_bytes();
    let (mut pattern_index, mut name_index) = (0, 0);
    let mut backtrack: Option<(usize, usize)> = None;
    while name_index < name.len() {
        if pattern_index < pattern.len() && pattern[pattern_index] == b'*' {
            backtrack = Some((pattern_index, name_index));
            pattern_index += 1;
        } else if pattern_index < pattern.len() && pattern[pattern_index] == name[name_index] {
            pattern_index += 1;
            name_index += 1;
        } else if let Some((star, matched)) = backtrack {
            pattern_index = star + 1;
            name_index = matched + 1;
            backtrack = Some((star, matched + 1));
        } else {
            return false;
        }
    }
    pattern[pattern_index..].iter().all(|byte| *byte == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link_message(message_type: u16, index: u32, flags: u32, name: &str) -> Vec<u8> {
        let mut attribute = Vec::new();
        let attribute_length = 4 + name.len() + 1;
        attribute.extend_from_slice(&(attribute_length as u16).to_ne_bytes());
        attribute.extend_from_slice(&IFLA_IFNAME.to_ne_bytes());
        attribute.extend_from_slice(name.as_bytes());
        attribute.push(0);
        while attribute.len() % 4 != 0 {
            attribute.push(0);
        }
        let length = NLMSG_HEADER_LENGTH + IFINFOMSG_LENGTH + attribute.len();
        let mut message = Vec::new();
        message.extend_from_slice(&(length as u32).to_ne_bytes());
        message.extend_from_slice(&message_type.to_ne_bytes());
        message.extend_from_slice(&[0u8; 10]);
        message.extend_from_slice(&[0u8; 4]);
        message.extend_from_slice(&index.to_ne_bytes());
        message.extend_from_slice(&flags.to_ne_bytes());
        message.extend_from_slice(&0u32.to_ne_bytes());
        message.extend_from_slice(&attribute);
        message
    }

    #[test]
    fn new_and_removed_links_are_read_from_one_buffer() {
        let mut buffer = link_message(RTM_NEWLINK, 7, IFF_UP, "veth1234");
        buffer.extend(link_message(RTM_DELLINK, 5, 0, "cali99"));
        assert_eq!(
            parse_messages(&buffer),
            vec![
                InterfaceEvent::Changed {
                    index: 7,
                    name: "veth1234".into(),
                    up: true
                },
                InterfaceEvent::Removed {
                    index: 5,
                    name: "cali99".into()
                },
            ]
        );
    }

    #[test]
    fn a_truncated_message_yields_nothing_instead_of_garbage() {
        let buffer = link_message(RTM_NEWLINK, 7, IFF_UP, "veth1234");
        assert!(parse_messages(&buffer[..buffer.len() - 9]).is_empty());
    }

    #[test]
    fn globs_match_like_the_shell_for_star_patterns() {
        assert!(glob_matches("veth*", "veth0a1b"));
        assert!(glob_matches("*", "eth0"));
        assert!(glob_matches("lxc*x", "lxc12x"));
        assert!(!glob_matches("veth*", "eth0"));
        assert!(!glob_matches("cali*", "cal"));
        assert!(glob_matches("eth0", "eth0"));
        assert!(!glob_matches("eth0", "eth01"));
    }
}
