//! Attaching programs idempotently and atomically.
//!
//! Rules (issue 3, and Calico's tc storms as the counter-example):
//! - One link per interface, direction and agent, pinned under `<pin dir>/links/`
//!   by interface index. A pinned link that is still attached to that interface is
//!   reused: kept as it is when its program has the same tag (same instructions) as
//!   the one just loaded, or updated in place (`BPF_LINK_UPDATE`) when not, so a
//!   hook never has zero or two of our programs.
//! - Egress first, then ingress: egress alone only reverses flows that some
//!   ingress created, so a failure in between never leaves new flows translated
//!   without their replies being translated back.
//! - TCX where the kernel has it (6.6+), clsact otherwise; under clsact the filter
//!   has a fixed priority and handle, so attaching again replaces it in place.

use std::{
    os::fd::AsFd as _,
    path::{Path, PathBuf},
};

use aya::{
    programs::{
        links::{CgroupAttachMode, FdLink},
        tc::{self, NlOptions, SchedClassifierLink, TcAttachOptions, TcHandle},
        CgroupSock, CgroupSockAddr, LinkOrder, ProgramError, ProgramFd, SchedClassifier, SockOps,
        TcAttachType,
    },
    Ebpf,
};
use switchyard_common::program_names;

use super::{links_directory, pin_fd, program_mut, system, LoaderSettings};
use crate::Error;

/// How TC programs are attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttachMode {
    /// TCX links on kernels that have them (6.6 and later), clsact otherwise.
    Auto,
    Tcx,
    Clsact,
}

impl AttachMode {
    fn resolve(self) -> Self {
        match self {
            Self::Auto => {
                let tcx = aya::util::KernelVersion::current()
                    .map(|version| version >= aya::util::KernelVersion::new(6, 6, 0))
                    .unwrap_or(false);
                if tcx {
                    Self::Tcx
                } else {
                    Self::Clsact
                }
            }
            other => other,
        }
    }
}

/// Which ingress program an interface gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InterfaceKind {
    /// Host side of a pod's interface: `internalTrafficPolicy` applies.
    Pod,
    /// The node's external interfaces: `externalTrafficPolicy` applies.
    Host,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Ingress,
    Egress,
}

impl Direction {
    fn name(self) -> &'static str {
        match self {
            Self::Ingress => "ingress",
            Self::Egress => "egress",
        }
    }

    fn tc(self) -> TcAttachType {
        match self {
            Self::Ingress => TcAttachType::Ingress,
            Self::Egress => TcAttachType::Egress,
        }
    }
}

/// What attaching did on one hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttachOutcome {
    /// Nothing was attached; a new link was created and pinned.
    Created,
    /// The same program was already attached through our pinned link.
    Kept,
    /// Our pinned link now runs the newly loaded program (atomic update).
    Replaced,
}

pub(crate) struct SocketHook {
    pub program: &'static str,
    pub hook: &'static str,
}

pub(crate) const SOCKET_HOOKS: [SocketHook; 4] = [
    SocketHook {
        program: program_names::CONNECT4,
        hook: "connect4",
    },
    SocketHook {
        program: program_names::SENDMSG4,
        hook: "sendmsg4",
    },
    SocketHook {
        program: program_names::RECVMSG4,
        hook: "recvmsg4",
    },
    SocketHook {
        program: program_names::GETPEERNAME4,
        hook: "getpeername4",
    },
];

/// The IPv6 hooks: on the same cgroup, attached only when IPv6 is a served
/// family (`LoaderSettings::ipv6_socket_hooks`), detached otherwise.
pub(crate) const SOCKET_HOOKS_IPV6: [SocketHook; 4] = [
    SocketHook {
        program: program_names::CONNECT6,
        hook: "connect6",
    },
    SocketHook {
        program: program_names::SENDMSG6,
        hook: "sendmsg6",
    },
    SocketHook {
        program: program_names::RECVMSG6,
        hook: "recvmsg6",
    },
    SocketHook {
        program: program_names::GETPEERNAME6,
        hook: "getpeername6",
    },
];

/// The address hooks the settings ask for: the IPv4 ones always, the IPv6 ones
/// when IPv6 is served.
pub(crate) fn socket_hooks(settings: &LoaderSettings) -> impl Iterator<Item = &'static SocketHook> {
    let ipv6: &'static [SocketHook] = if settings.ipv6_socket_hooks {
        &SOCKET_HOOKS_IPV6
    } else {
        &[]
    };
    SOCKET_HOOKS.iter().chain(ipv6)
}

/// Removes a closing socket's reverse entry: on the same cgroup as the hooks
/// above, but a `cgroup/sock_release` program, another program type.
pub(crate) const RELEASE_HOOK: SocketHook = SocketHook {
    program: program_names::SOCK_RELEASE,
    hook: "sock_release",
};

/// What makes an attached program "the same" as one just loaded: the same
/// instructions (tag) *and* the same maps. After a schema conversion the new
/// programs may have the very same instructions as the old ones but use the new
/// maps; keeping the old program then would leave it on the old maps.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct ProgramIdentity {
    tag: [u8; 8],
    map_ids: Vec<u32>,
}

impl ProgramIdentity {
    pub(crate) fn of_fd(program: std::os::fd::BorrowedFd<'_>) -> std::io::Result<Self> {
        Ok(Self {
            tag: system::program_tag_of_fd(program)?,
            map_ids: system::program_identity(program)?.1,
        })
    }

    fn of_id(program_id: u32) -> std::io::Result<Self> {
        Ok(Self {
            tag: system::program_tag_of_id(program_id)?,
            map_ids: system::program_identity_of_id(program_id)?.1,
        })
    }

    /// Without CAP_SYS_ADMIN the lookup by id fails and the answer is no: the
    /// caller then updates the link in place to the (identical) new program.
    fn is_attached_as(&self, attached_program_id: u32) -> bool {
        Self::of_id(attached_program_id).ok().as_ref() == Some(self)
    }
}

/// Fixed clsact filter priority and handle: attaching again replaces our filter
/// instead of adding a second one.
const CLSACT_PRIORITY: u16 = 0x5359;
const CLSACT_HANDLE: TcHandle = TcHandle::new(0, 0x5359);

fn tcx_link_path(pin_directory: &Path, ifindex: u32, direction: Direction) -> PathBuf {
    links_directory(pin_directory).join(format!("tcx-{ifindex}-{}", direction.name()))
}

fn clsact_marker_path(pin_directory: &Path, ifindex: u32, direction: Direction) -> PathBuf {
    links_directory(pin_directory).join(format!("clsact-{ifindex}-{}", direction.name()))
}

fn attach_error(
    program: &'static str,
    target: &str,
    cause: impl std::error::Error + Send + Sync + 'static,
) -> Error {
    Error::AttachProgram {
        program,
        target: target.to_string(),
        source: Box::new(cause),
    }
}

pub(crate) fn attach_interface(
    ebpf: &mut Ebpf,
    settings: &LoaderSettings,
    interface: &str,
    kind: InterfaceKind,
) -> Result<[AttachOutcome; 2], Error> {
    let ingress_program = match kind {
        InterfaceKind::Pod => program_names::INGRESS_POD,
        InterfaceKind::Host => program_names::INGRESS_HOST,
    };
    let ifindex = system::interface_index(interface).ok_or_else(|| Error::AttachProgram {
        program: ingress_program,
        target: interface.to_string(),
        source: "no such interface".into(),
    })?;
    let attach = |ebpf: &mut Ebpf, program_name, direction| {
        let target = TcTarget {
            pin_directory: &settings.pin_directory,
            interface,
            ifindex,
            direction,
            program_name,
        };
        match settings.attach_mode.resolve() {
            AttachMode::Clsact => attach_clsact(ebpf, &target),
            _ => attach_tcx(ebpf, &target),
        }
    };
    let egress = attach(ebpf, program_names::EGRESS, Direction::Egress)?;
    let ingress = attach(ebpf, ingress_program, Direction::Ingress)?;
    Ok([ingress, egress])
}

/// One TC program on one side of one interface.
struct TcTarget<'a> {
    pin_directory: &'a Path,
    interface: &'a str,
    ifindex: u32,
    direction: Direction,
    program_name: &'static str,
}

impl TcTarget<'_> {
    fn error(&self, cause: impl std::error::Error + Send + Sync + 'static) -> Error {
        attach_error(self.program_name, self.interface, cause)
    }
}

fn attach_tcx(ebpf: &mut Ebpf, target: &TcTarget<'_>) -> Result<AttachOutcome, Error> {
    let path = tcx_link_path(target.pin_directory, target.ifindex, target.direction);
    let program: &mut SchedClassifier = program_mut(ebpf, target.program_name)?;
    let program_fd = program.fd().map_err(|error| target.error(error))?;
    // A link whose interface is gone (a defunct link reports interface 0), or
    // whose index now names another device, is not reused: start afresh.
    let reused = reuse_pinned_link(
        &path,
        program_fd.as_fd(),
        |info| info.link_type == system::LINK_TYPE_TCX && info.tcx_ifindex == target.ifindex,
        |error| target.error(error),
    )?;
    if let Some(outcome) = reused {
        return Ok(outcome);
    }
    let link_id = program
        .attach_with_options(
            target.interface,
            target.direction.tc(),
            TcAttachOptions::TcxOrder(LinkOrder::default()),
        )
        .map_err(|error| target.error(error))?;
    let link = program
        .take_link(link_id)
        .map_err(|error| target.error(error))?;
    let link: FdLink = link.try_into().map_err(|error| target.error(error))?;
    // Dropping the pinned handle closes our descriptor; the pin keeps the link.
    link.pin(&path).map_err(|error| target.error(error))?;
    Ok(AttachOutcome::Created)
}

fn attach_clsact(ebpf: &mut Ebpf, target: &TcTarget<'_>) -> Result<AttachOutcome, Error> {
    // Adding the qdisc fails harmlessly when it exists already.
    let _ = tc::qdisc_add_clsact(target.interface);
    let program: &mut SchedClassifier = program_mut(ebpf, target.program_name)?;
    let existing = SchedClassifierLink::attached(
        target.interface,
        target.direction.tc(),
        CLSACT_PRIORITY,
        CLSACT_HANDLE,
        None,
    )
    .map_err(|error| target.error(error))?;
    // Replace our filter in place if it exists (NLM_F_REPLACE), else create it.
    let (link_id, outcome) = match program.attach_to_link(existing) {
        Ok(link_id) => (link_id, AttachOutcome::Replaced),
        Err(_) => {
            let link_id = program
                .attach_with_options(
                    target.interface,
                    target.direction.tc(),
                    TcAttachOptions::Netlink(NlOptions {
                        priority: CLSACT_PRIORITY,
                        handle: CLSACT_HANDLE,
                        classid: None,
                    }),
                )
                .map_err(|error| target.error(error))?;
            (link_id, AttachOutcome::Created)
        }
    };
    let link = program
        .take_link(link_id)
        .map_err(|error| target.error(error))?;
    // A netlink filter lives until removed; dropping aya's handle would remove it.
    std::mem::forget(link);
    // The marker (a pin of the program) tells detach where our filters are.
    let marker = clsact_marker_path(target.pin_directory, target.ifindex, target.direction);
    let _ = std::fs::remove_file(&marker);
    let program_fd = program.fd().map_err(|error| target.error(error))?;
    pin_fd(&program_fd.as_fd(), &marker)?;
    Ok(outcome)
}

pub(crate) fn attach_socket_hooks(
    ebpf: &mut Ebpf,
    settings: &LoaderSettings,
    cgroup: &Path,
) -> Result<Vec<AttachOutcome>, Error> {
    let target = cgroup.display().to_string();
    let mut outcomes = Vec::new();
    if !settings.ipv6_socket_hooks {
        // An earlier process that served IPv6 left its IPv6 hooks: IPv6 is not
        // served any more, so they go (their programs would keep translating).
        for hook in &SOCKET_HOOKS_IPV6 {
            detach_and_remove_pin(&cgroup_link_path(settings, hook))?;
        }
    }
    for hook in socket_hooks(settings) {
        let program: &mut CgroupSockAddr = program_mut(ebpf, hook.program)?;
        let program_fd = owned_program_fd(program.fd(), hook, &target)?;
        outcomes.push(attach_cgroup_hook(
            settings,
            cgroup,
            hook,
            program_fd,
            |cgroup_file| {
                let link_id = program.attach(cgroup_file, CgroupAttachMode::Single)?;
                Ok(FdLink::try_from(program.take_link(link_id)?)?)
            },
        )?);
    }
    let program: &mut CgroupSock = program_mut(ebpf, RELEASE_HOOK.program)?;
    let program_fd = owned_program_fd(program.fd(), &RELEASE_HOOK, &target)?;
    outcomes.push(attach_cgroup_hook(
        settings,
        cgroup,
        &RELEASE_HOOK,
        program_fd,
        |cgroup_file| {
            let link_id = program.attach(cgroup_file, CgroupAttachMode::Single)?;
            Ok(FdLink::try_from(program.take_link(link_id)?)?)
        },
    )?);
    Ok(outcomes)
}

/// The `sock_ops` program counting the connection signals: on the same cgroup
/// as the socket hooks, but attached at load, whatever the node's dataplane
/// (it counts and translates nothing).
pub(crate) const CONNECTION_SIGNALS_HOOK: SocketHook = SocketHook {
    program: program_names::SOCK_OPS,
    hook: "sock_ops",
};

/// Attaches (or keeps) the `sock_ops` program on `cgroup`, like a socket hook.
pub(crate) fn attach_connection_signals(
    ebpf: &mut Ebpf,
    settings: &LoaderSettings,
    cgroup: &Path,
) -> Result<AttachOutcome, Error> {
    let target = cgroup.display().to_string();
    let program: &mut SockOps = program_mut(ebpf, CONNECTION_SIGNALS_HOOK.program)?;
    let program_fd = owned_program_fd(program.fd(), &CONNECTION_SIGNALS_HOOK, &target)?;
    attach_cgroup_hook(
        settings,
        cgroup,
        &CONNECTION_SIGNALS_HOOK,
        program_fd,
        |cgroup_file| {
            let link_id = program.attach(cgroup_file, CgroupAttachMode::Single)?;
            Ok(FdLink::try_from(program.take_link(link_id)?)?)
        },
    )
}

/// A descriptor of the program's own: `attach_cgroup_hook` needs it while its
/// `attach` closure holds the program mutably.
fn owned_program_fd(
    program_fd: Result<&ProgramFd, ProgramError>,
    hook: &SocketHook,
    target: &str,
) -> Result<ProgramFd, Error> {
    program_fd
        .map_err(|error| attach_error(hook.program, target, error))?
        .try_clone()
        .map_err(|error| attach_error(hook.program, target, error))
}

fn cgroup_link_path(settings: &LoaderSettings, hook: &SocketHook) -> PathBuf {
    links_directory(&settings.pin_directory).join(format!("cgroup-{}", hook.hook))
}

/// Attaches one cgroup hook through a link pinned as `links/cgroup-<hook>`: an
/// existing link keeps its program if it is ours already, or is updated to it
/// in place (the hook never runs zero or two of our programs); otherwise
/// `attach` makes a new link, which is pinned.
fn attach_cgroup_hook(
    settings: &LoaderSettings,
    cgroup: &Path,
    hook: &SocketHook,
    program_fd: ProgramFd,
    attach: impl FnOnce(&std::fs::File) -> Result<FdLink, Box<dyn std::error::Error + Send + Sync>>,
) -> Result<AttachOutcome, Error> {
    let target = cgroup.display().to_string();
    let path = cgroup_link_path(settings, hook);
    let reused = reuse_pinned_link(
        &path,
        program_fd.as_fd(),
        |info| info.link_type == system::LINK_TYPE_CGROUP,
        |error| attach_error(hook.program, &target, error),
    )?;
    if let Some(outcome) = reused {
        return Ok(outcome);
    }
    let cgroup_file =
        std::fs::File::open(cgroup).map_err(|error| attach_error(hook.program, &target, error))?;
    // A cgroup *link* always shares the hook with other programs (systemd's, a
    // CNI's); the kernel refuses the legacy ALLOW_MULTI flag on links, so
    // "single" (flags 0) is the right mode here.
    let link = attach(&cgroup_file).map_err(|error| Error::AttachProgram {
        program: hook.program,
        target: target.clone(),
        source: error,
    })?;
    link.pin(&path)
        .map_err(|error| attach_error(hook.program, &target, error))?;
    Ok(AttachOutcome::Created)
}

/// Reuses the link an earlier run pinned at `path`, if there is one that `usable`
/// accepts: it is `Kept` when it runs our program already, else updated to it in
/// place (`Replaced`: the hook never runs zero or two of our programs). An
/// unusable link's pin is removed, and `None` (as without a pin) says a new link
/// is needed. `failed` names the attach an error belongs to.
fn reuse_pinned_link(
    path: &Path,
    program_fd: std::os::fd::BorrowedFd<'_>,
    usable: impl Fn(&system::LinkInfo) -> bool,
    failed: impl Fn(std::io::Error) -> Error,
) -> Result<Option<AttachOutcome>, Error> {
    let ours = ProgramIdentity::of_fd(program_fd).map_err(&failed)?;
    match system::open_pinned(path) {
        Ok(link) => {
            let info = system::link_info(link.as_fd()).map_err(&failed)?;
            if usable(&info) {
                if ours.is_attached_as(info.program_id) {
                    return Ok(Some(AttachOutcome::Kept));
                }
                system::link_update(link.as_fd(), program_fd).map_err(&failed)?;
                return Ok(Some(AttachOutcome::Replaced));
            }
            remove_pin(path)?;
            Ok(None)
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(failed(error)),
    }
}

/// Detaches the link pinned at `path` (if it is one and is still attached), then
/// removes the pin.
fn detach_and_remove_pin(path: &Path) -> Result<(), Error> {
    if let Ok(link) = system::open_pinned(path) {
        let is_link = system::link_info(link.as_fd()).is_ok();
        if is_link {
            // ENOLINK/EINVAL: already detached (defunct), which is what we want.
            let _ = system::link_detach(link.as_fd());
        }
    }
    remove_pin(path)
}

fn remove_pin(path: &Path) -> Result<(), Error> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(error) => Err(Error::DetachProgram {
            target: path.display().to_string(),
            source: error.into(),
        }),
    }
}

/// Removes a clsact filter of ours, if the interface still exists.
fn remove_clsact_filters(ifindex: u32, direction: Direction) -> Result<(), Error> {
    let Some(interface) = system::interface_name(ifindex) else {
        return Ok(());
    };
    let programs: &[&str] = match direction {
        Direction::Ingress => &[program_names::INGRESS_POD, program_names::INGRESS_HOST],
        Direction::Egress => &[program_names::EGRESS],
    };
    for program in programs {
        match tc::qdisc_detach_program(&interface, direction.tc(), program) {
            Ok(()) => {}
            Err(tc::TcError::IoError(error)) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => {
                return Err(Error::DetachProgram {
                    target: interface.clone(),
                    source: error.into(),
                })
            }
        }
    }
    Ok(())
}

pub(crate) fn detach_interface(settings: &LoaderSettings, interface: &str) -> Result<(), Error> {
    let Some(ifindex) = system::interface_index(interface) else {
        return Ok(());
    };
    for direction in [Direction::Ingress, Direction::Egress] {
        let marker = clsact_marker_path(&settings.pin_directory, ifindex, direction);
        if marker.exists() {
            remove_clsact_filters(ifindex, direction)?;
            remove_pin(&marker)?;
        }
        detach_and_remove_pin(&tcx_link_path(&settings.pin_directory, ifindex, direction))?;
    }
    Ok(())
}

/// Parses `tcx-<ifindex>-<direction>` / `clsact-<ifindex>-<direction>`.
fn parse_link_name(name: &str) -> Option<(bool, u32, Direction)> {
    let (clsact, rest) = if let Some(rest) = name.strip_prefix("tcx-") {
        (false, rest)
    } else {
        (true, name.strip_prefix("clsact-")?)
    };
    let (index, direction) = rest.split_once('-')?;
    let direction = match direction {
        "ingress" => Direction::Ingress,
        "egress" => Direction::Egress,
        _ => return None,
    };
    Some((clsact, index.parse().ok()?, direction))
}

/// Interfaces with a live pinned link; pins of links whose interface is gone are
/// removed on the way.
pub(crate) fn attached_interface_indexes(pin_directory: &Path) -> Result<Vec<u32>, Error> {
    live_link_interfaces(pin_directory, true)
}

/// Interfaces with a live pinned link, touching nothing.
pub(crate) fn attached_interface_indexes_read_only(
    pin_directory: &Path,
) -> Result<Vec<u32>, Error> {
    live_link_interfaces(pin_directory, false)
}

fn live_link_interfaces(pin_directory: &Path, prune_defunct: bool) -> Result<Vec<u32>, Error> {
    let directory = links_directory(pin_directory);
    let mut indexes = Vec::new();
    let entries = match std::fs::read_dir(&directory) {
        Ok(entries) => entries,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(indexes),
        Err(error) => {
            return Err(Error::DetachProgram {
                target: directory.display().to_string(),
                source: error.into(),
            })
        }
    };
    for entry in entries.flatten() {
        let Some((clsact, index, _)) = parse_link_name(&entry.file_name().to_string_lossy()) else {
            continue;
        };
        // Links of interfaces that are gone are defunct (a TCX link then reports
        // interface 0): not counted, and their pins pruned if asked to.
        let gone = if clsact {
            system::interface_name(index).is_none()
        } else {
            system::open_pinned(&entry.path())
                .and_then(|link| system::link_info(link.as_fd()))
                .map(|info| info.tcx_ifindex == 0)
                .unwrap_or(true)
        };
        if gone {
            if prune_defunct {
                remove_pin(&entry.path())?;
            }
            continue;
        }
        if !indexes.contains(&index) {
            indexes.push(index);
        }
    }
    indexes.sort_unstable();
    Ok(indexes)
}

/// Pinned hooks (link pins, clsact markers) whose program is none of `ours`
/// (same instructions and same maps): hooks that still run programs on other
/// maps. Links of interfaces that are gone are not counted (they run nothing).
/// A link running one of `our_program_ids` is ours without a lookup by id
/// (which needs CAP_SYS_ADMIN, which the agent does without).
pub(crate) fn hooks_running_other_programs(
    pin_directory: &Path,
    ours: &std::collections::BTreeSet<ProgramIdentity>,
    our_program_ids: &std::collections::BTreeSet<u32>,
) -> Result<Vec<String>, Error> {
    let directory = links_directory(pin_directory);
    let entries = match std::fs::read_dir(&directory) {
        Ok(entries) => entries,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(error) => {
            return Err(Error::DetachProgram {
                target: directory.display().to_string(),
                source: error.into(),
            })
        }
    };
    let mut waiting = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Ok(pinned) = system::open_pinned(&entry.path()) else {
            continue;
        };
        let identity = if name.starts_with("clsact-") {
            // The marker is a pin of the program our filter was last given.
            ProgramIdentity::of_fd(pinned.as_fd()).ok()
        } else {
            match system::link_info(pinned.as_fd()) {
                Ok(info) if info.link_type == system::LINK_TYPE_TCX && info.tcx_ifindex == 0 => {
                    continue
                }
                Ok(info) if our_program_ids.contains(&info.program_id) => continue,
                Ok(info) => ProgramIdentity::of_id(info.program_id).ok(),
                Err(_) => None,
            }
        };
        if !identity.is_some_and(|identity| ours.contains(&identity)) {
            waiting.push(name);
        }
    }
    waiting.sort();
    Ok(waiting)
}

pub(crate) fn detach_all_links(pin_directory: &Path) -> Result<(), Error> {
    let directory = links_directory(pin_directory);
    let entries = match std::fs::read_dir(&directory) {
        Ok(entries) => entries,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(error) => {
            return Err(Error::DetachProgram {
                target: directory.display().to_string(),
                source: error.into(),
            })
        }
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some((true, ifindex, direction)) = parse_link_name(&name) {
            remove_clsact_filters(ifindex, direction)?;
            remove_pin(&entry.path())?;
        } else {
            detach_and_remove_pin(&entry.path())?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_pin_names_round_trip_to_interface_and_direction() {
        let path = tcx_link_path(Path::new("/pins"), 17, Direction::Egress);
        let name = path
            .file_name()
            .map(|name| name.to_string_lossy().into_owned());
        assert_eq!(name.as_deref(), Some("tcx-17-egress"));
        assert_eq!(
            parse_link_name("tcx-17-egress"),
            Some((false, 17, Direction::Egress))
        );
        assert_eq!(
            parse_link_name("clsact-3-ingress"),
            Some((true, 3, Direction::Ingress))
        );
    }

    #[test]
    fn other_pins_are_not_taken_for_interface_links() {
        assert_eq!(parse_link_name("cgroup-connect4"), None);
        assert_eq!(parse_link_name("tcx-x-ingress"), None);
        assert_eq!(parse_link_name("tcx-3-sideways"), None);
    }
}
