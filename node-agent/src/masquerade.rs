//! The agent's own nat rule: packets the programs marked (NodePort traffic to a
//! backend on another node) are masqueraded on their way out, so replies come
//! back through this node to be translated. A chain of our own, jumped to from
//! POSTROUTING, so that it is found, checked and removed as one thing.
//! Installed only once a Service needs it (`desired::masquerades_remote_backends`):
//! a nat rule turns on netfilter's connection tracking in the namespace.

use std::process::Command;

use crate::Error;

pub const CHAIN: &str = "SWITCHYARD-POSTROUTING";

fn iptables(arguments: &[&str]) -> Result<bool, Error> {
    let output = Command::new("iptables")
        .arg("-w")
        .args(arguments)
        .output()
        .map_err(|error| Error::ProgramMasquerade {
            source: Box::new(error),
        })?;
    Ok(output.status.success())
}

fn require(arguments: &[&str]) -> Result<(), Error> {
    if iptables(arguments)? {
        Ok(())
    } else {
        Err(Error::ProgramMasquerade {
            source: format!("iptables {} failed", arguments.join(" ")).into(),
        })
    }
}

/// The rule matching `mark`, as iptables arguments after the chain.
fn rule(mark: &str) -> Vec<&str> {
    vec!["-m", "mark", "--mark", mark, "-j", "MASQUERADE"]
}

/// Creates the chain, its rule and the jump if any is missing; idempotent.
pub fn ensure(mark: u32) -> Result<(), Error> {
    let mark = format!("{mark:#x}/{mark:#x}");
    if !iptables(&["-t", "nat", "-L", CHAIN, "-n"])? {
        require(&["-t", "nat", "-N", CHAIN])?;
    }
    let mut check = vec!["-t", "nat", "-C", CHAIN];
    check.extend(rule(&mark));
    if !iptables(&check)? {
        let mut append = vec!["-t", "nat", "-A", CHAIN];
        append.extend(rule(&mark));
        require(&append)?;
    }
    if !iptables(&["-t", "nat", "-C", "POSTROUTING", "-j", CHAIN])? {
        require(&["-t", "nat", "-I", "POSTROUTING", "1", "-j", CHAIN])?;
    }
    Ok(())
}

/// Removes the jump and the chain (`--detach-on-exit`); absent ones are fine.
pub fn remove() -> Result<(), Error> {
    while iptables(&["-t", "nat", "-D", "POSTROUTING", "-j", CHAIN])? {}
    if iptables(&["-t", "nat", "-L", CHAIN, "-n"])? {
        require(&["-t", "nat", "-F", CHAIN])?;
        require(&["-t", "nat", "-X", CHAIN])?;
    }
    Ok(())
}
