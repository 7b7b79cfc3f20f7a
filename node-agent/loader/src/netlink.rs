//! The one netlink socket of the agent: notifications of link and address
//! changes (`RTMGRP_LINK`, `RTMGRP_IPV4_IFADDR`, `RTMGRP_IPV6_IFADDR`), so that a
//! new pod interface or a new node address reaches the agent within
//! milliseconds, without polling. The messages themselves are not parsed: a
//! notification only says "read the interfaces again" (the agent reads them
//! whole, which also covers a lost notification after a socket overrun).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

use crate::Error;

const RTMGRP_LINK: u32 = 0x1;
const RTMGRP_IPV4_IFADDR: u32 = 0x10;
const RTMGRP_IPV6_IFADDR: u32 = 0x100;
/// Notifications come in bursts (a veth pair: two links, addresses, up): after
/// the first one the watcher waits this long, then drains them all at once.
const SETTLE: Duration = Duration::from_millis(20);

/// A netlink socket subscribed to link and address changes of the calling
/// thread's network namespace.
pub struct ChangeWatcher {
    socket: OwnedFd,
}

impl ChangeWatcher {
    pub fn new() -> Result<Self, Error> {
        let watch_error = |source| Error::WatchInterfaces { source };
        let socket = open_socket(libc::NETLINK_ROUTE).map_err(watch_error)?;
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
            match receive(&self.socket, &mut buffer, libc::MSG_DONTWAIT) {
                Ok(0) | Err(_) => return true,
                Ok(_) => {}
            }
        }
    }
}

/// A netlink socket of `protocol` (`NETLINK_ROUTE`, `NETLINK_SOCK_DIAG`) in the
/// calling thread's network namespace, closed on exec.
pub(crate) fn open_socket(protocol: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2) call.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            protocol,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd was just returned by socket(2); nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Sends `message` to the kernel over `socket`.
pub(crate) fn send(socket: &OwnedFd, message: &[u8]) -> io::Result<()> {
    // SAFETY: valid socket and a buffer valid for the length passed.
    let sent = unsafe {
        libc::send(
            socket.as_raw_fd(),
            message.as_ptr().cast(),
            message.len(),
            0,
        )
    };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Receives into `buffer` from `socket` (`recv(2)` with `flags`); the length
/// received, 0 when the socket has nothing more to give.
pub(crate) fn receive(
    socket: &OwnedFd,
    buffer: &mut [u8],
    flags: libc::c_int,
) -> io::Result<usize> {
    // SAFETY: valid socket and a buffer valid for the length passed.
    let received = unsafe {
        libc::recv(
            socket.as_raw_fd(),
            buffer.as_mut_ptr().cast(),
            buffer.len(),
            flags,
        )
    };
    // Negative only on failure, with errno set.
    usize::try_from(received).map_err(|_| io::Error::last_os_error())
}
