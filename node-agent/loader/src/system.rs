//! The few bpf(2) and socket calls aya 0.14 does not expose: opening any pinned
//! object, reading a link's kernel info (which program, which interface), updating
//! a link in place, and reading a program's tag by id.

use std::{
    ffi::CString,
    io,
    os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd},
    path::Path,
};

const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
const BPF_OBJ_GET: libc::c_long = 7;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
const BPF_LINK_UPDATE: libc::c_long = 29;
const BPF_LINK_DETACH: libc::c_long = 34;
/// `bpf_link_type`: the two kinds of link the agent pins.
pub const LINK_TYPE_CGROUP: u32 = 3;
pub const LINK_TYPE_TCX: u32 = 11;

fn bpf(command: libc::c_long, attribute: &mut [u8]) -> io::Result<libc::c_long> {
    // SAFETY: `attribute` is a valid, writable buffer of the length we pass; the
    // kernel reads (and for info calls writes) at most that many bytes.
    let result = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            command,
            attribute.as_mut_ptr(),
            attribute.len() as libc::c_uint,
        )
    };
    if result < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(result)
    }
}

fn put_u32(buffer: &mut [u8], offset: usize, value: u32) {
    buffer[offset..offset + 4].copy_from_slice(&value.to_ne_bytes());
}

fn put_u64(buffer: &mut [u8], offset: usize, value: u64) {
    buffer[offset..offset + 8].copy_from_slice(&value.to_ne_bytes());
}

fn get_u32(buffer: &[u8], offset: usize) -> u32 {
    let mut bytes = [0u8; 4];
    bytes.copy_from_slice(&buffer[offset..offset + 4]);
    u32::from_ne_bytes(bytes)
}

fn owned(fd: libc::c_long) -> OwnedFd {
    // SAFETY: the kernel just returned this descriptor to us and nobody else owns it.
    unsafe { OwnedFd::from_raw_fd(fd as i32) }
}

/// Opens a pinned BPF object (map, program or link).
pub fn open_pinned(path: &Path) -> io::Result<OwnedFd> {
    use std::os::unix::ffi::OsStrExt as _;
    let path = CString::new(path.as_os_str().as_bytes())
        .map_err(|error| io::Error::new(io::ErrorKind::InvalidInput, error))?;
    let mut attribute = [0u8; 16];
    put_u64(&mut attribute, 0, path.as_ptr() as u64);
    bpf(BPF_OBJ_GET, &mut attribute).map(owned)
}

/// What the kernel says about a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkInfo {
    pub link_type: u32,
    pub link_id: u32,
    pub program_id: u32,
    /// For a TCX link, the interface it is attached to; zero once the interface is
    /// gone (the link is then defunct).
    pub tcx_ifindex: u32,
}

/// Fills `info` with what the kernel says about a BPF object (program, map or
/// link): the `bpf_*_info` structure of its kind, as far as `info` reaches.
fn object_info(object: BorrowedFd<'_>, info: &mut [u8]) -> io::Result<()> {
    let mut attribute = [0u8; 16];
    put_u32(&mut attribute, 0, object.as_raw_fd() as u32);
    put_u32(&mut attribute, 4, info.len() as u32);
    put_u64(&mut attribute, 8, info.as_mut_ptr() as u64);
    bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attribute).map(|_| ())
}

/// The first `N` 32-bit fields of what the kernel says about a BPF object: the
/// head of its `bpf_*_info` structure.
fn object_info_head<const N: usize>(object: BorrowedFd<'_>) -> io::Result<[u32; N]> {
    let mut info = [0u8; 128];
    object_info(object, &mut info)?;
    Ok(std::array::from_fn(|field| get_u32(&info, 4 * field)))
}

pub fn link_info(link: BorrowedFd<'_>) -> io::Result<LinkInfo> {
    // struct bpf_link_info { u32 type; u32 id; u32 prog_id; union (8-aligned) at 16 }
    let [link_type, link_id, program_id, _, tcx_ifindex] = object_info_head(link)?;
    Ok(LinkInfo {
        link_type,
        link_id,
        program_id,
        tcx_ifindex,
    })
}

/// Replaces the program of a link atomically: the hook is never empty.
pub fn link_update(link: BorrowedFd<'_>, program: BorrowedFd<'_>) -> io::Result<()> {
    let mut attribute = [0u8; 16];
    put_u32(&mut attribute, 0, link.as_raw_fd() as u32);
    put_u32(&mut attribute, 4, program.as_raw_fd() as u32);
    bpf(BPF_LINK_UPDATE, &mut attribute).map(|_| ())
}

/// Detaches a link at once. Removing a link's last pin also detaches it, but the
/// kernel does that from a work queue, a moment later; callers that promise
/// "nothing is attached any more" detach explicitly first.
pub fn link_detach(link: BorrowedFd<'_>) -> io::Result<()> {
    let mut attribute = [0u8; 16];
    put_u32(&mut attribute, 0, link.as_raw_fd() as u32);
    bpf(BPF_LINK_DETACH, &mut attribute).map(|_| ())
}

/// The shape of a map: what must match for a map to be reused by another
/// version of the programs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MapShape {
    pub map_type: u32,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
}

pub fn map_shape(map: BorrowedFd<'_>) -> io::Result<MapShape> {
    // struct bpf_map_info { u32 type; u32 id; u32 key_size; u32 value_size; u32 max_entries; ... }
    let [map_type, _, key_size, value_size, max_entries] = object_info_head(map)?;
    Ok(MapShape {
        map_type,
        key_size,
        value_size,
        max_entries,
    })
}

/// The tag (hash of the instructions, independent of map descriptors) of a program.
pub fn program_tag_of_fd(program: BorrowedFd<'_>) -> io::Result<[u8; 8]> {
    let mut info = [0u8; 256];
    object_info(program, &mut info)?;
    // struct bpf_prog_info { u32 type; u32 id; u8 tag[8]; ... }
    let mut tag = [0u8; 8];
    tag.copy_from_slice(&info[8..16]);
    Ok(tag)
}

pub fn program_tag_of_id(id: u32) -> io::Result<[u8; 8]> {
    let mut attribute = [0u8; 16];
    put_u32(&mut attribute, 0, id);
    let fd = bpf(BPF_PROG_GET_FD_BY_ID, &mut attribute).map(owned)?;
    use std::os::fd::AsFd as _;
    program_tag_of_fd(fd.as_fd())
}

/// The cookie of the calling thread's network namespace (`SO_NETNS_COOKIE`), which
/// the socket hooks compare with `bpf_get_netns_cookie`.
pub fn network_namespace_cookie() -> io::Result<u64> {
    const SO_NETNS_COOKIE: libc::c_int = 71;
    let socket = std::net::UdpSocket::bind("127.0.0.1:0")
        .or_else(|_| std::net::UdpSocket::bind("[::1]:0"))?;
    let mut cookie: u64 = 0;
    let mut length = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: valid socket, and a buffer of the size we pass.
    let result = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_NETNS_COOKIE,
            (&mut cookie as *mut u64).cast(),
            &mut length,
        )
    };
    if result != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cookie)
}

/// `CLOCK_MONOTONIC` in nanoseconds: the clock of `bpf_ktime_get_ns`.
pub fn monotonic_nanoseconds() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}

/// The interface index of a name, or `None` if there is no such interface.
pub fn interface_index(name: &str) -> Option<u32> {
    let name = CString::new(name).ok()?;
    // SAFETY: valid C string.
    let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
    (index != 0).then_some(index)
}

/// The name of an interface index, or `None` if there is no such interface.
pub fn interface_name(index: u32) -> Option<String> {
    let mut buffer = [0 as libc::c_char; libc::IF_NAMESIZE];
    // SAFETY: the buffer is IF_NAMESIZE long, as the call requires.
    let result = unsafe { libc::if_indextoname(index, buffer.as_mut_ptr()) };
    if result.is_null() {
        return None;
    }
    // SAFETY: if_indextoname wrote a NUL-terminated string into the buffer.
    let name = unsafe { std::ffi::CStr::from_ptr(buffer.as_ptr()) };
    Some(name.to_string_lossy().into_owned())
}

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
/// `BPF_NOEXIST`: insert only if the key is absent.
pub const UPDATE_NO_EXIST: u64 = 1;
/// `BPF_ANY`: insert or overwrite.
pub const UPDATE_ANY: u64 = 0;

/// Creates a map (used to make maps of a given layout, e.g. an older schema
/// version's in tests). `name` is cut to 15 characters.
pub fn map_create(
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    name: &str,
) -> io::Result<OwnedFd> {
    // union bpf_attr for BPF_MAP_CREATE: type, key_size, value_size, max_entries,
    // map_flags, inner_map_fd, numa_node, then map_name[16] at offset 28.
    let mut attribute = [0u8; 72];
    put_u32(&mut attribute, 0, map_type);
    put_u32(&mut attribute, 4, key_size);
    put_u32(&mut attribute, 8, value_size);
    put_u32(&mut attribute, 12, max_entries);
    let name = name.as_bytes();
    let length = name.len().min(15);
    attribute[28..28 + length].copy_from_slice(&name[..length]);
    bpf(BPF_MAP_CREATE, &mut attribute).map(owned)
}

/// Pins any BPF object.
pub fn pin_object(fd: BorrowedFd<'_>, path: &Path) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt as _;
    const BPF_OBJ_PIN: libc::c_long = 6;
    let path = CString::new(path.as_os_str().as_bytes())
        .map_err(|error| io::Error::new(io::ErrorKind::InvalidInput, error))?;
    let mut attribute = [0u8; 16];
    put_u64(&mut attribute, 0, path.as_ptr() as u64);
    put_u32(&mut attribute, 8, fd.as_raw_fd() as u32);
    bpf(BPF_OBJ_PIN, &mut attribute).map(|_| ())
}

fn element_attribute(map: BorrowedFd<'_>, key: u64, value: u64, flags: u64) -> [u8; 32] {
    // struct { u32 map_fd; (pad); u64 key; u64 value or next_key; u64 flags; }
    let mut attribute = [0u8; 32];
    put_u32(&mut attribute, 0, map.as_raw_fd() as u32);
    put_u64(&mut attribute, 8, key);
    put_u64(&mut attribute, 16, value);
    put_u64(&mut attribute, 24, flags);
    attribute
}

const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
const BPF_MAP_DELETE_BATCH: libc::c_long = 27;

/// Every entry of a hash or array map, read in batches (`BPF_MAP_LOOKUP_BATCH`),
/// which walks a hash map bucket by bucket: entries evicted or added meanwhile
/// never make it start over or stop early, as a key-by-key walk does when the
/// key it continues from has been evicted (an LRU map under load).
pub fn map_entries(
    map: BorrowedFd<'_>,
    key_size: usize,
    value_size: usize,
) -> io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let mut entries = Vec::new();
    map_entries_in_chunks(map, key_size, value_size, |keys, values, count| {
        for index in 0..count {
            entries.push((
                keys[index * key_size..(index + 1) * key_size].to_vec(),
                values[index * value_size..(index + 1) * value_size].to_vec(),
            ));
        }
        Ok(())
    })?;
    Ok(entries)
}

/// Entries read in one `BPF_MAP_LOOKUP_BATCH` call, at most.
pub const LOOKUP_CHUNK: usize = 4096;

/// Walks a hash or array map in batches as [`map_entries`] does, handing each
/// batch to `on_chunk` (keys and values packed back to back, and how many) before
/// reading the next: a caller that acts on what it read (the conntrack expiry
/// deletes) does so moments after reading it, not after the whole walk.
pub fn map_entries_in_chunks(
    map: BorrowedFd<'_>,
    key_size: usize,
    value_size: usize,
    mut on_chunk: impl FnMut(&[u8], &[u8], usize) -> io::Result<()>,
) -> io::Result<()> {
    let mut keys = vec![0u8; key_size * LOOKUP_CHUNK];
    let mut values = vec![0u8; value_size * LOOKUP_CHUNK];
    // The batch token is a bucket index for hash maps and a key for arrays.
    let token_size = key_size.max(8);
    let mut in_token = vec![0u8; token_size];
    let mut out_token = vec![0u8; token_size];
    let mut first = true;
    loop {
        // struct { u64 in_batch; u64 out_batch; u64 keys; u64 values; u32 count;
        //          u32 map_fd; u64 elem_flags; u64 flags; }
        let mut attribute = [0u8; 56];
        put_u64(
            &mut attribute,
            0,
            if first { 0 } else { in_token.as_ptr() as u64 },
        );
        put_u64(&mut attribute, 8, out_token.as_mut_ptr() as u64);
        put_u64(&mut attribute, 16, keys.as_mut_ptr() as u64);
        put_u64(&mut attribute, 24, values.as_mut_ptr() as u64);
        put_u32(&mut attribute, 32, LOOKUP_CHUNK as u32);
        put_u32(&mut attribute, 36, map.as_raw_fd() as u32);
        let result = bpf(BPF_MAP_LOOKUP_BATCH, &mut attribute);
        let done = match result {
            Ok(_) => false,
            Err(error) if error.raw_os_error() == Some(libc::ENOENT) => true,
            Err(error) => return Err(error),
        };
        let count = (get_u32(&attribute, 32) as usize).min(LOOKUP_CHUNK);
        on_chunk(&keys, &values, count)?;
        if done {
            return Ok(());
        }
        in_token.copy_from_slice(&out_token);
        first = false;
    }
}

/// Deletes the keys of `key_size` bytes packed back to back in `keys`
/// (`BPF_MAP_DELETE_BATCH`, one call for many), skipping keys that are gone
/// already. Returns how many it deleted.
pub fn map_delete_keys(map: BorrowedFd<'_>, keys: &[u8], key_size: usize) -> io::Result<usize> {
    let count = keys.len() / key_size;
    let mut deleted = 0;
    let mut start = 0;
    while start < count {
        let remaining = count - start;
        let mut attribute = [0u8; 56];
        put_u64(&mut attribute, 16, keys[start * key_size..].as_ptr() as u64);
        put_u32(&mut attribute, 32, remaining as u32);
        put_u32(&mut attribute, 36, map.as_raw_fd() as u32);
        let result = bpf(BPF_MAP_DELETE_BATCH, &mut attribute);
        // The kernel reports in `count` how many keys it deleted before it
        // stopped: all of them, or those before the one that failed.
        let done = (get_u32(&attribute, 32) as usize).min(remaining);
        deleted += done;
        match result {
            Ok(_) => return Ok(deleted),
            // A key the programs or a previous sweep removed meanwhile: skip it.
            Err(error) if error.raw_os_error() == Some(libc::ENOENT) => start += done + 1,
            Err(error) => return Err(error),
        }
    }
    Ok(deleted)
}

const BPF_MAP_LOOKUP_AND_DELETE_ELEM: libc::c_long = 21;
/// The kernel's `ENOTSUPP` (not in libc): what `BPF_MAP_LOOKUP_AND_DELETE_ELEM`
/// answers for a hash map on kernels before 5.14.
const KERNEL_ENOTSUPP: i32 = 524;

/// Removes `key` and returns the value it held at that moment, in one step
/// (`BPF_MAP_LOOKUP_AND_DELETE_ELEM`): `None` if it was absent. A kernel that
/// cannot do this for the map's type answers `ErrorKind::Unsupported`.
pub fn map_take(map: BorrowedFd<'_>, key: &[u8], value_size: usize) -> io::Result<Option<Vec<u8>>> {
    let mut value = vec![0u8; value_size];
    let mut attribute = element_attribute(map, key.as_ptr() as u64, value.as_mut_ptr() as u64, 0);
    match bpf(BPF_MAP_LOOKUP_AND_DELETE_ELEM, &mut attribute) {
        Ok(_) => Ok(Some(value)),
        Err(error) if error.raw_os_error() == Some(libc::ENOENT) => Ok(None),
        Err(error)
            if matches!(
                error.raw_os_error(),
                Some(KERNEL_ENOTSUPP | libc::EOPNOTSUPP | libc::EINVAL)
            ) =>
        {
            Err(io::Error::new(io::ErrorKind::Unsupported, error))
        }
        Err(error) => Err(error),
    }
}

/// The value of `key`, or `None` if absent.
pub fn map_lookup(
    map: BorrowedFd<'_>,
    key: &[u8],
    value_size: usize,
) -> io::Result<Option<Vec<u8>>> {
    let mut value = vec![0u8; value_size];
    let mut attribute = element_attribute(map, key.as_ptr() as u64, value.as_mut_ptr() as u64, 0);
    match bpf(BPF_MAP_LOOKUP_ELEM, &mut attribute) {
        Ok(_) => Ok(Some(value)),
        Err(error) if error.raw_os_error() == Some(libc::ENOENT) => Ok(None),
        Err(error) => Err(error),
    }
}

/// Writes one entry (`flags`: [`UPDATE_ANY`] or [`UPDATE_NO_EXIST`]). The caller
/// passes a key and value of the map's sizes.
pub fn map_update(map: BorrowedFd<'_>, key: &[u8], value: &[u8], flags: u64) -> io::Result<()> {
    let mut attribute = element_attribute(map, key.as_ptr() as u64, value.as_ptr() as u64, flags);
    bpf(BPF_MAP_UPDATE_ELEM, &mut attribute).map(|_| ())
}

/// The id of a program and the ids of the maps it uses (sorted). Two programs
/// with the same instructions (the same tag) but different maps differ here.
pub fn program_identity(program: BorrowedFd<'_>) -> io::Result<(u32, Vec<u32>)> {
    let mut map_ids = [0u32; 64];
    let mut info = [0u8; 256];
    // struct bpf_prog_info: nr_map_ids (u32) at 52, map_ids (u64 pointer) at 56.
    put_u32(&mut info, 52, map_ids.len() as u32);
    put_u64(&mut info, 56, map_ids.as_mut_ptr() as u64);
    object_info(program, &mut info)?;
    let count = (get_u32(&info, 52) as usize).min(map_ids.len());
    let mut ids = map_ids[..count].to_vec();
    ids.sort_unstable();
    Ok((get_u32(&info, 4), ids))
}

/// [`program_identity`] of a program given by id.
pub fn program_identity_of_id(id: u32) -> io::Result<(u32, Vec<u32>)> {
    let mut attribute = [0u8; 16];
    put_u32(&mut attribute, 0, id);
    let fd = bpf(BPF_PROG_GET_FD_BY_ID, &mut attribute).map(owned)?;
    use std::os::fd::AsFd as _;
    program_identity(fd.as_fd())
}

/// The kernel id of a map (what [`program_identity`] lists).
pub fn map_id(map: BorrowedFd<'_>) -> io::Result<u32> {
    let mut info = [0u8; 128];
    object_info(map, &mut info)?;
    Ok(get_u32(&info, 4))
}

/// Runs `body` on each CPU in turn (`sched_setaffinity` of the calling thread),
/// with the CPU's index and the number of CPUs, then restores the thread's
/// affinity. Used to fill LRU maps with per-CPU lists (`BPF_F_NO_COMMON_LRU`),
/// which take an insert from the inserting CPU's share only: filled from one CPU,
/// they would evict their own new entries after `max_entries / CPUs`.
pub fn on_each_cpu(mut body: impl FnMut(usize, usize) -> io::Result<()>) -> io::Result<()> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; the calls get its size.
    let mut original: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: valid out-pointer of the size passed.
    if unsafe { libc::sched_getaffinity(0, size, &mut original) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let cpus: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
        // SAFETY: index below CPU_SETSIZE.
        .filter(|cpu| unsafe { libc::CPU_ISSET(*cpu, &original) })
        .collect();
    let mut result = Ok(());
    for (index, cpu) in cpus.iter().enumerate() {
        // SAFETY: as above.
        let mut only: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: index below CPU_SETSIZE.
        unsafe { libc::CPU_SET(*cpu, &mut only) };
        // SAFETY: valid set of the size passed.
        if unsafe { libc::sched_setaffinity(0, size, &only) } != 0 {
            result = Err(io::Error::last_os_error());
            break;
        }
        if let Err(error) = body(index, cpus.len()) {
            result = Err(error);
            break;
        }
    }
    // SAFETY: restores the set read above.
    if unsafe { libc::sched_setaffinity(0, size, &original) } != 0 && result.is_ok() {
        result = Err(io::Error::last_os_error());
    }
    result
}
