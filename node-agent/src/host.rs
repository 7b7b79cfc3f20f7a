//! The host's interfaces and addresses, re-read when netlink says a link or an
//! address changed (the loader's [`ChangeWatcher`]), so a new pod interface or
//! a new node address reaches the agent within milliseconds, without polling.
//! A slow rescan (every 30 s) covers a lost notification (socket overrun).

use std::time::Duration;

use switchyard_loader::netlink::ChangeWatcher;
use tokio::sync::mpsc;

use crate::core::Input;
use crate::interfaces::{read_interfaces, IpInterface};
use crate::Error;

/// A slow rescan that covers a notification lost to a socket overrun.
const RESCAN_INTERVAL: Duration = Duration::from_secs(30);

/// Reads the host's interfaces now and after every change, sending each new view
/// to the agent; runs on its own thread until the agent is gone.
pub fn watch_host(
    inputs: mpsc::UnboundedSender<Input>,
) -> Result<std::thread::JoinHandle<()>, Error> {
    let watcher = ChangeWatcher::new()?;
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
                        tracing::warn!(error = %switchyard_model::error::chain(&error), "cannot read the host's interfaces; retrying");
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
