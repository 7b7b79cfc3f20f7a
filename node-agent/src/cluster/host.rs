//! The host's interfaces and addresses, re-read when netlink says a link or an
//! address changed (`RTMGRP_LINK`, `RTMGRP_IPV4_IFADDR`, `RTMGRP_IPV6_IFADDR`),
//! so a new pod interface or a new node address reaches the agent within
//! milliseconds, without polling. A slow rescan (every 30 s) covers a lost
//! notification (socket overrun).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

use tokio::sync::mpsc;

use super::agent::Input;
use crate::standalone::interfaces::{read_interfaces, IpInterface};
use crate::Error;

const RTMGRP_LINK: u32 = 0x1;
const RTMGRP_IPV4_IFADDR: u32 = 0x10;
const RTMGRP_IPV6_IFADDR: u32 = 0x100;
const RESCAN_INTERVAL: Duration = Duration::from_secs(30);
/// Notifications come in bursts (a veth pair: two links, addresses, up): the
/// rescan waits this long after the first one.
const SETTLE: Duration = Duration::from_millis(20);

/// A netlink socket subscribed to link and address changes.
pub struct AddressWatcher {
    socket: OwnedFd,
}

impl AddressWatcher {
    pub fn new() -> Result<Self, Error> {
        let watch_error = |source| Error::WatchInterfaces { source };
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
        // SAFETY: zeroed sockaddr_nl is valid; family and groups are filled in.
        let mut address: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        address.nl_family = libc::AF_NETLINK as u16;
        address.nl_groups = RTMGRP_LINK | RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR;
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

    /// Waits up to `timeout` for notifications and drains them; returns whether
    /// any arrived (an error, such as an overrun, counts as "something changed").
    pub fn wait(&self, timeout: Duration) -> bool {
        let mut poll = libc::pollfd {
            fd: self.socket.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let milliseconds = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd.
        let ready = unsafe { libc::poll(&mut poll, 1, milliseconds) };
        if ready <= 0 {
            return ready < 0;
        }
        std::thread::sleep(SETTLE);
        let mut buffer = vec![0u8; 64 * 1024];
        loop {
            // SAFETY: valid socket and buffer of the length passed.
            let length = unsafe {
                libc::recv(
                    self.socket.as_raw_fd(),
                    buffer.as_mut_ptr().cast(),
                    buffer.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if length <= 0 {
                return true;
            }
        }
    }
}

/// Reads the host's interfaces now and after every change, sending each new view
/// to the agent; runs on its own thread until the agent is gone.
pub fn watch_host(
    inputs: mpsc::UnboundedSender<Input>,
) -> Result<std::thread::JoinHandle<()>, Error> {
    let watcher = AddressWatcher::new()?;
    Ok(std::thread::spawn(move || {
        let mut last: Option<Vec<IpInterface>> = None;
        let mut reported_error = false;
        loop {
            match read_interfaces() {
                Ok(interfaces) => {
                    reported_error = false;
                    if last.as_ref() != Some(&interfaces) {
                        last = Some(interfaces.clone());
                        if inputs.send(Input::Host(interfaces)).is_err() {
                            return;
                        }
                    }
                }
                Err(error) => {
                    if !reported_error {
                        tracing::warn!(%error, "cannot read the host's interfaces; retrying");
                        reported_error = true;
                    }
                }
            }
            if inputs.is_closed() {
                return;
            }
            let timeout = if reported_error {
                Duration::from_secs(1)
            } else {
                RESCAN_INTERVAL
            };
            watcher.wait(timeout);
        }
    }))
}
