//! Loading the kernel programs, pinning their maps, programs and links, attaching
//! them to interfaces and to the cgroup root, and the real `ServiceMaps`.
//!
//! Everything the datapath needs to keep working lives in the BPF filesystem under
//! the pin directory, so a process that dies (SIGKILL included) leaves traffic
//! flowing, and the next one picks up where it stopped:
//!
//! ```text
//! <pin dir>/v<SCHEMA_VERSION>/SY_*            maps (reused by the next process)
//! <pin dir>/v<SCHEMA_VERSION>/programs/sy_*   programs
//! <pin dir>/links/tcx-<ifindex>-<direction>   TCX links (version independent, so
//!                                             an upgrade updates them in place)
//! <pin dir>/links/cgroup-<hook>               cgroup socket hook links
//! ```

mod attach;
mod error;
pub mod expiry;
mod live_flows;
mod migrate;
pub mod netlink;
mod pinned_maps;
pub mod pins;
mod port_filter;
pub mod schema;
pub mod system;
#[cfg(test)]
mod test_entries;
pub mod udp_flows;
pub mod udp_sockets;

use std::path::{Path, PathBuf};

use aya::{
    programs::{CgroupSock, CgroupSockAddr, SchedClassifier, SockOps},
    Ebpf, EbpfLoader,
};
use switchyard_common::{map_names, program_names, SCHEMA_VERSION};

pub use attach::{AttachMode, AttachOutcome, Direction, InterfaceKind};
pub use pinned_maps::{live_tcp_flow_count, Counters, PinnedServiceMaps};

pub use error::Error;

/// The kernel programs, built by `build.rs` and embedded in the binary.
static PROGRAM_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/switchyard"));

/// Default pin directory (`--bpf-pin-dir`).
pub const DEFAULT_PIN_DIRECTORY: &str = "/sys/fs/bpf/switchyard";
/// The cgroup v2 root, where the socket hooks go so that every process of the
/// node's network namespace is covered: the first `cgroup2` mount (`/sys/fs/cgroup`
/// on unified hosts, `/sys/fs/cgroup/unified` on hybrid ones).
pub fn default_cgroup_path() -> Option<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
    mounts.lines().find_map(|line| {
        let mut fields = line.split_whitespace();
        let _source = fields.next()?;
        let mount_point = fields.next()?;
        (fields.next()? == "cgroup2").then(|| PathBuf::from(mount_point))
    })
}

/// Map sizes, set when the maps are created. Pinned maps are reused with the size
/// they were created with (resizing would drop every connection's state).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MapSizes {
    pub frontends: u32,
    pub backend_slots: u32,
    pub conntrack: u32,
    /// The LRU that takes new flows while the conntrack hash is full.
    pub conntrack_overflow: u32,
    pub affinity: u32,
    pub socket_reverse: u32,
}

impl Default for MapSizes {
    /// Calico's defaults for Services; conntrack sized for a busy node.
    fn default() -> Self {
        Self {
            frontends: 65_536,
            backend_slots: 262_144,
            conntrack: 524_288,
            conntrack_overflow: 65_536,
            affinity: 65_536,
            socket_reverse: 65_536,
        }
    }
}

/// What the loader needs to know.
#[derive(Debug, Clone)]
pub struct LoaderSettings {
    pub pin_directory: PathBuf,
    pub map_sizes: MapSizes,
    /// cgroup v2 directory the socket hooks attach to; `None` attaches none.
    pub cgroup_path: Option<PathBuf>,
    /// Load and attach the IPv6 socket hooks too (IPv6 is a served family);
    /// without, IPv6 hooks an earlier process attached are detached.
    pub ipv6_socket_hooks: bool,
    pub attach_mode: AttachMode,
    /// The map layouts and the conversions between them: [`schema::SCHEMA`]
    /// except in tests that need another history (e.g. a previous version with
    /// the current layout, to take maps over under load).
    pub schema: &'static schema::Schema,
}

impl Default for LoaderSettings {
    fn default() -> Self {
        Self {
            pin_directory: PathBuf::from(DEFAULT_PIN_DIRECTORY),
            map_sizes: MapSizes::default(),
            cgroup_path: default_cgroup_path(),
            ipv6_socket_hooks: false,
            attach_mode: AttachMode::Auto,
            schema: &schema::SCHEMA,
        }
    }
}

/// Directory of the maps and programs of one schema version.
pub fn version_directory(pin_directory: &Path, version: u32) -> PathBuf {
    pin_directory.join(format!("v{version}"))
}

pub fn links_directory(pin_directory: &Path) -> PathBuf {
    pin_directory.join("links")
}

const TC_PROGRAMS: [&str; 3] = [
    program_names::INGRESS_POD,
    program_names::INGRESS_HOST,
    program_names::EGRESS,
];

/// The loaded programs (the maps they use are pinned and opened separately through
/// [`PinnedServiceMaps`]).
pub struct Datapath {
    ebpf: Ebpf,
    settings: LoaderSettings,
    /// Older schema versions found at load, newest first; their pins are removed
    /// by [`Datapath::finish_migration`] once the new programs run on every hook.
    migrated_versions: Vec<u32>,
    /// The programs this process loaded (instructions and maps): a hook runs
    /// "the new programs" when its program is identical to one of these.
    programs: std::collections::BTreeSet<attach::ProgramIdentity>,
    /// The kernel's ids of those programs: a hook running one of them is known
    /// as ours from its link alone, without looking the program up by id (which
    /// needs CAP_SYS_ADMIN).
    program_ids: std::collections::BTreeSet<u32>,
    /// Whether the wait for hooks still running old programs has been logged.
    migration_wait_reported: bool,
    /// `CLOCK_MONOTONIC` when this process last copied flow state from the old
    /// maps (the conversion, then each merge); zero when it converted none (a
    /// previous process did, so every old entry is a candidate for the merge).
    converted_at_nanoseconds: u64,
    /// Whether a hook has been switched to the new programs yet.
    switch_started: bool,
    /// Removes expired conntrack entries while this process runs (see `expiry`).
    conntrack_expiry: expiry::ConntrackExpiry,
}

fn io_error<'a>(step: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> Error + 'a {
    move |source| Error::PreparePinDirectory {
        step,
        path: path.to_path_buf(),
        source,
    }
}

impl Datapath {
    /// Loads the programs (running the verifier), creating the pinned maps or
    /// reusing them, and pins the programs. Maps of an older schema version found
    /// under the pin directory are taken over when their layout is unchanged and
    /// converted into new maps when it changed; maps of a newer version, or of an
    /// older one this agent cannot convert, are refused with nothing touched (see
    /// `migrate` and `schema`).
    pub fn load(settings: LoaderSettings) -> Result<Self, Error> {
        // Decide from what is pinned before touching anything: a refusal leaves
        // the pin directory exactly as it was.
        if settings.schema.current != SCHEMA_VERSION {
            return Err(Error::LoadPrograms {
                source: None,
                what: format!(
                    "the schema's current version {} is not the programs' {SCHEMA_VERSION}",
                    settings.schema.current
                ),
            });
        }
        // The pins must go to a BPF filesystem: anywhere else they would not be
        // pins, and elsewhere than the host's they would vanish with this process.
        pins::ensure_bpf_filesystem(&settings.pin_directory)?;
        let observation = migrate::observe(&settings.pin_directory)?;
        let plan = settings
            .schema
            .plan(&observation)
            .map_err(|refusal| Error::MigrateMaps {
                from_version: refusal.version(),
                source: refusal.to_string().into(),
            })?;
        let version_directory = version_directory(&settings.pin_directory, SCHEMA_VERSION);
        let programs_directory = version_directory.join("programs");
        let migrating = plan.maps.iter().any(|(_, source)| {
            matches!(
                source,
                schema::MapSource::Reuse { .. } | schema::MapSource::Convert { .. }
            )
        });
        // A migration builds the new maps in a staging directory renamed into
        // place when complete; a staging directory found now was left by a
        // process that died half way, and is redone.
        let maps_directory = if migrating {
            let staging = migrate::staging_directory(&settings.pin_directory);
            migrate::remove_directory(&staging, "remove the unfinished conversion in")?;
            // The plan refuses a current directory holding maps next to maps to
            // take over, so anything here (program pins of a process that died
            // before its maps were complete) is unused.
            migrate::remove_directory(&version_directory, "clear")?;
            staging
        } else {
            migrate::remove_directory(
                &migrate::staging_directory(&settings.pin_directory),
                "remove the unfinished conversion in",
            )?;
            version_directory.clone()
        };
        for directory in [&maps_directory, &links_directory(&settings.pin_directory)] {
            std::fs::create_dir_all(directory).map_err(io_error("create", directory))?;
        }
        let converted_at_nanoseconds = if plan.converts() {
            system::monotonic_nanoseconds()
        } else {
            0
        };
        let sizes = settings.map_sizes;
        let mut loader = EbpfLoader::new();
        loader
            .default_map_pin_directory(&maps_directory)
            .map_max_entries(map_names::FRONTENDS, sizes.frontends)
            .map_max_entries(map_names::BACKEND_SLOTS, sizes.backend_slots)
            .map_max_entries(map_names::CONNTRACK, sizes.conntrack)
            .map_max_entries(map_names::CONNTRACK_OVERFLOW, sizes.conntrack_overflow)
            .map_max_entries(map_names::AFFINITY, sizes.affinity)
            .map_max_entries(map_names::SOCKET_REVERSE, sizes.socket_reverse);
        let old_path = |name: &str, version: u32| {
            self::version_directory(&settings.pin_directory, version).join(name)
        };
        let reused: Vec<(&str, u32, PathBuf)> = plan
            .maps
            .iter()
            .filter_map(|(name, source)| match source {
                schema::MapSource::Reuse { version } => {
                    Some((*name, *version, old_path(name, *version)))
                }
                _ => None,
            })
            .collect();
        for (name, _, path) in &reused {
            loader.map_pin_path(name, path.as_path());
        }
        let mut ebpf = loader
            .load(PROGRAM_OBJECT)
            .map_err(|error| Error::LoadPrograms {
                what: format!(
                    "the object was refused{}",
                    pins::lacking_capabilities_hint()
                ),
                source: Some(error.into()),
            })?;
        for (name, version, path) in &reused {
            let fd = system::open_pinned(path).map_err(|error| Error::MigrateMaps {
                from_version: *version,
                source: format!("cannot open {}: {error}", path.display()).into(),
            })?;
            pin_fd(&fd, &maps_directory.join(name))?;
            tracing::info!(map = %name, from = %path.display(), "took over a map of an older schema version");
        }
        for (name, source) in &plan.maps {
            if let schema::MapSource::Convert { version } = source {
                let converted = migrate::convert_map(
                    settings.schema,
                    *version,
                    name,
                    &old_path(name, *version),
                    &maps_directory.join(name),
                )?;
                tracing::info!(map = %name, from_version = version, entries = converted, "converted a map of an older schema version");
            }
        }
        if migrating {
            std::fs::rename(&maps_directory, &version_directory)
                .map_err(io_error("move the converted maps into", &version_directory))?;
        }
        // Before any program of this process is attached: a new port filter would
        // otherwise hide the flows and Services the maps already hold from it. A
        // built one (the previous process of this version) is complete already.
        let mut maps = PinnedServiceMaps::open_version(&version_directory)?;
        if !maps.port_filter_built()? {
            let marked = maps.mark_ports_in_use()?;
            tracing::info!(
                entries = marked,
                "built the port filter from the ports the maps hold"
            );
        }
        std::fs::create_dir_all(&programs_directory)
            .map_err(io_error("create", &programs_directory))?;

        let mut programs = std::collections::BTreeSet::new();
        let mut program_ids = std::collections::BTreeSet::new();
        let mut add_identity = |(identity, id)| {
            programs.insert(identity);
            program_ids.insert(id);
        };
        for name in TC_PROGRAMS {
            let program: &mut SchedClassifier = program_mut(&mut ebpf, name)?;
            program.load().map_err(|error| load_error(name, error))?;
            add_identity(program_identity(program.fd(), name)?);
            pin_program(program.fd(), &programs_directory, name)?;
        }
        for name in attach::socket_hooks(&settings).map(|hook| hook.program) {
            let program: &mut CgroupSockAddr = program_mut(&mut ebpf, name)?;
            program.load().map_err(|error| load_error(name, error))?;
            add_identity(program_identity(program.fd(), name)?);
            pin_program(program.fd(), &programs_directory, name)?;
        }
        let name = attach::RELEASE_HOOK.program;
        let program: &mut CgroupSock = program_mut(&mut ebpf, name)?;
        program.load().map_err(|error| load_error(name, error))?;
        add_identity(program_identity(program.fd(), name)?);
        pin_program(program.fd(), &programs_directory, name)?;
        let name = attach::CONNECTION_SIGNALS_HOOK.program;
        let program: &mut SockOps = program_mut(&mut ebpf, name)?;
        program.load().map_err(|error| load_error(name, error))?;
        add_identity(program_identity(program.fd(), name)?);
        pin_program(program.fd(), &programs_directory, name)?;
        // Counting only, so attached at once, whatever the node's dataplane: a
        // node still on kube-proxy measures its baseline with it.
        if let Some(cgroup) = &settings.cgroup_path {
            match attach::attach_connection_signals(&mut ebpf, &settings, cgroup) {
                Ok(outcome) => tracing::debug!(?outcome, "connection signals attached"),
                // The datapath works without it; the agent reports the
                // connection signals as not measured.
                Err(error) => tracing::warn!(
                    error = %error_chain(&error),
                    "cannot attach the sock_ops program: the connection signals are not measured"
                ),
            }
        }
        let conntrack_expiry = expiry::ConntrackExpiry::start(&version_directory)?;
        Ok(Self {
            conntrack_expiry,
            ebpf,
            settings,
            migrated_versions: plan.older_versions,
            programs,
            program_ids,
            migration_wait_reported: false,
            converted_at_nanoseconds,
            switch_started: false,
        })
    }

    /// What this process's conntrack sweeps have done, once one has run.
    pub fn conntrack_sweep_report(&self) -> Option<expiry::SweepReport> {
        self.conntrack_expiry.report()
    }

    pub fn settings(&self) -> &LoaderSettings {
        &self.settings
    }

    /// Opens the pinned maps of the current schema version for reading and writing.
    pub fn service_maps(&self) -> Result<PinnedServiceMaps, Error> {
        PinnedServiceMaps::open(&self.settings.pin_directory)
    }

    /// Attaches (or keeps, or updates in place) the ingress program for `kind` and
    /// the egress program on one interface. See `attach` for the rules.
    pub fn attach_interface(
        &mut self,
        interface: &str,
        kind: InterfaceKind,
    ) -> Result<[AttachOutcome; 2], Error> {
        self.merge_before_the_switch()?;
        attach::attach_interface(&mut self.ebpf, &self.settings, interface, kind)
    }

    /// Attaches the socket hooks to the configured cgroup (idempotent too).
    pub fn attach_socket_hooks(&mut self) -> Result<Vec<AttachOutcome>, Error> {
        self.merge_before_the_switch()?;
        match self.settings.cgroup_path.clone() {
            Some(cgroup) => attach::attach_socket_hooks(&mut self.ebpf, &self.settings, &cgroup),
            None => Ok(Vec::new()),
        }
    }

    /// Merges into converted flow-state maps what the old programs wrote or
    /// refreshed since the last merge (or the conversion), newest older version
    /// only: any older ones are leftovers whose state is already in it.
    fn merge_flow_state(&mut self, when: &str) -> Result<(), Error> {
        let Some(newest) = self.migrated_versions.first().copied() else {
            return Ok(());
        };
        let started = if self.converted_at_nanoseconds == 0 {
            0
        } else {
            system::monotonic_nanoseconds()
        };
        let mut merged_any = false;
        for name in schema::FLOW_STATE_MAPS {
            let merged = migrate::merge_flow_state(
                self.settings.schema,
                &self.settings.pin_directory,
                newest,
                name,
                self.converted_at_nanoseconds,
            )?;
            if merged > 0 {
                merged_any = true;
                tracing::info!(map = %name, from_version = newest, entries = merged, "merged flow state written by the old programs {when}");
            }
        }
        if merged_any {
            // The merged flows and sockets may use ports of backends gone since the
            // port filter was built: mark theirs too, or their lookups would skip them.
            PinnedServiceMaps::open(&self.settings.pin_directory)?.mark_ports_in_use()?;
        }
        self.converted_at_nanoseconds = started;
        Ok(())
    }

    /// Right before the first hook of a converting process switches: merges what
    /// the old programs wrote while the new ones were being verified (hundreds of
    /// milliseconds), so only flows opened during the switch itself wait for the
    /// merge after it.
    fn merge_before_the_switch(&mut self) -> Result<(), Error> {
        if self.switch_started || self.converted_at_nanoseconds == 0 {
            return Ok(());
        }
        self.merge_flow_state("while the new programs were loaded")?;
        self.switch_started = true;
        Ok(())
    }

    /// Removes this agent's programs from one interface (its links and pins).
    pub fn detach_interface(&self, interface: &str) -> Result<(), Error> {
        attach::detach_interface(&self.settings, interface)
    }

    /// Ends a schema migration once every pinned hook runs one of this process's
    /// programs: merges what the old programs wrote into converted flow-state
    /// maps since the conversion, then removes the old versions' pins (a map
    /// taken over lives on under the new version). Until then it does nothing,
    /// so callers may call it after every round of attaching; it is cheap when
    /// there is nothing to migrate.
    pub fn finish_migration(&mut self) -> Result<(), Error> {
        if self.migrated_versions.is_empty() {
            return Ok(());
        }
        let waiting = attach::hooks_running_other_programs(
            &self.settings.pin_directory,
            &self.programs,
            &self.program_ids,
        )?;
        if !waiting.is_empty() {
            if !self.migration_wait_reported {
                tracing::info!(
                    hooks = ?waiting,
                    "the old schema version's maps stay until these hooks run the new programs"
                );
                self.migration_wait_reported = true;
            }
            return Ok(());
        }
        // Only the newest older version was taken over; any older ones are
        // leftovers whose state is already in it.
        self.merge_flow_state("during the switch")?;
        for version in std::mem::take(&mut self.migrated_versions) {
            migrate::finish(&self.settings.pin_directory, version)?;
            tracing::info!(version, "removed the pins of an older schema version");
        }
        Ok(())
    }

    /// Interfaces with a pinned link of this agent, by interface index. Pins of
    /// links whose interface has disappeared are removed on the way.
    pub fn attached_interfaces(&self) -> Result<Vec<u32>, Error> {
        attach::attached_interface_indexes(&self.settings.pin_directory)
    }
}

/// Whether programs pinned under `pin_directory` (by an earlier process) are
/// attached to some interface: known from the pinned links before loading, and
/// read without touching anything (a load refused afterwards must find the pin
/// directory as it was). An unreadable link directory counts as no.
pub fn programs_attached_under(pin_directory: &Path) -> bool {
    attach::attached_interface_indexes_read_only(pin_directory)
        .is_ok_and(|interfaces| !interfaces.is_empty())
}

/// Whether the `sock_ops` program counting the connection signals is attached
/// (its link pinned) under `pin_directory`: without it their counters count
/// nothing, and must not be read as zero events.
pub fn connection_signals_attached(pin_directory: &Path) -> bool {
    links_directory(pin_directory)
        .join(format!("cgroup-{}", attach::CONNECTION_SIGNALS_HOOK.hook))
        .exists()
}

/// Removes everything the agent attached and pinned under `pin_directory`:
/// every TCX link, clsact filter, cgroup link, program and map pin.
pub fn detach_everything(pin_directory: &Path) -> Result<(), Error> {
    attach::detach_all_links(pin_directory)?;
    if pin_directory.exists() {
        std::fs::remove_dir_all(pin_directory).map_err(io_error("remove", pin_directory))?;
    }
    Ok(())
}

/// An error with its sources, for a log line.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

fn program_mut<'a, T>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut T, Error>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
{
    let program = ebpf.program_mut(name).ok_or_else(|| Error::LoadPrograms {
        what: format!("program {name} is missing from the object"),
        source: None,
    })?;
    program
        .try_into()
        .map_err(|error: aya::programs::ProgramError| Error::LoadPrograms {
            what: format!("program {name} has an unexpected type"),
            source: Some(error.into()),
        })
}

/// A program's identity and its id.
fn program_identity(
    fd: Result<&aya::programs::ProgramFd, aya::programs::ProgramError>,
    name: &str,
) -> Result<(attach::ProgramIdentity, u32), Error> {
    use std::os::fd::AsFd as _;
    let fd = fd.map_err(|error| load_error(name, error))?;
    let unreadable = |error: std::io::Error| Error::LoadPrograms {
        what: format!("cannot read the identity of program {name}"),
        source: Some(error.into()),
    };
    let identity = attach::ProgramIdentity::of_fd(fd.as_fd()).map_err(unreadable)?;
    let (id, _) = system::program_identity(fd.as_fd()).map_err(unreadable)?;
    Ok((identity, id))
}

fn load_error(name: &str, error: aya::programs::ProgramError) -> Error {
    // The verifier log is in the Debug form of the error; keep all of it.
    Error::LoadPrograms {
        what: format!(
            "program {name} was rejected{}: {error:?}",
            pins::lacking_capabilities_hint()
        ),
        source: None,
    }
}

fn pin_program(
    fd: Result<&aya::programs::ProgramFd, aya::programs::ProgramError>,
    directory: &Path,
    name: &str,
) -> Result<(), Error> {
    use std::os::fd::AsFd as _;
    let fd = fd.map_err(|error| load_error(name, error))?;
    let path = directory.join(name);
    // Replace the previous process's pin: the program attached through a link
    // stays loaded through the link, whatever the pin points to.
    match std::fs::remove_file(&path) {
        Ok(()) => {}
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => return Err(io_error("replace", &path)(error)),
    }
    pin_fd(&fd.as_fd(), &path)
}

pub(crate) fn pin_fd(fd: &impl std::os::fd::AsFd, path: &Path) -> Result<(), Error> {
    system::pin_object(fd.as_fd(), path).map_err(|source| Error::PinObject {
        path: path.to_path_buf(),
        source: source.into(),
    })
}
