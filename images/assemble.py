"""Assembles one Switchyard image from unpacked Debian packages and a release binary,
and writes it as an OCI image layout archive (what `skopeo copy oci-archive:...`,
`ctr images import` and `kind load image-archive` read).

Called by images/build.sh. Reproducible by construction: every tar entry is written
in sorted order with uid/gid 0 (unless the image says otherwise), no user or group
names, mtimes clamped to SOURCE_DATE_EPOCH, gzip without a name or a time, and JSON
with sorted keys; nothing depends on the clock, the host's users or the order of a
directory listing.
"""

import argparse
import datetime
import fnmatch
import gzip
import hashlib
import io
import json
import os
import stat
import subprocess
import sys
import tarfile
import tomllib

# Where the dynamic loader looks for libraries without /etc/ld.so.cache (Debian's
# glibc searches the multiarch directories first).
LIBRARY_DIRECTORIES = [
    "lib/x86_64-linux-gnu",
    "usr/lib/x86_64-linux-gnu",
    "lib64",
    "usr/lib64",
    "lib",
    "usr/lib",
]

PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Debian's default `iptables` alternative is the nf_tables backend; the agent's
# masquerade rule and its guess of the node's default backend use plain `iptables`.
IPTABLES_ALTERNATIVES = {
    f"usr/sbin/{family}{suffix}": f"{family}-nft{suffix}"
    for family in ("iptables", "ip6tables")
    for suffix in ("", "-save", "-restore")
}

# What each image holds besides its binary. `files` are taken from the unpacked
# packages (globs allowed); every ELF file among them, and the binary, brings the
# shared libraries it needs (followed through DT_NEEDED to a fixed point).
IMAGES = {
    "agent": {
        "binary": "switchyard-agent",
        "description": "Switchyard node agent: serves a node's Services with eBPF "
        "and takes the node over from kube-proxy, and back, without dropping connections.",
        "files": [
            # iptables and ip6tables, legacy and nf_tables backends: the agent reads
            # and edits both with *-save and *-restore.
            "usr/sbin/xtables-legacy-multi",
            "usr/sbin/xtables-nft-multi",
            *(
                f"usr/sbin/{family}-{backend}{suffix}"
                for family in ("iptables", "ip6tables")
                for backend in ("legacy", "nft")
                for suffix in ("", "-save", "-restore")
            ),
            # Matches and targets, loaded by name when a rule uses them (kube-proxy's
            # rules use comment, mark, conntrack, statistic, MASQUERADE, ...). Not
            # ebtables' or arptables' ones.
            "usr/lib/x86_64-linux-gnu/xtables/libxt_*.so",
            "usr/lib/x86_64-linux-gnu/xtables/libipt_*.so",
            "usr/lib/x86_64-linux-gnu/xtables/libip6t_*.so",
            # kube-proxy's nftables mode and iptables-nft's tables, read with `nft -j`.
            "usr/sbin/nft",
            # `ip -j addr show` and `ip -o link show`: the node's addresses and interfaces.
            "bin/ip",
            # iptables resolves protocol names through these.
            "etc/protocols",
            "etc/services",
            "etc/os-release",
        ],
        "symlinks": IPTABLES_ALTERNATIVES,
        "passwd": ["root:x:0:0:root:/root:/usr/sbin/nologin"],
        "group": ["root:x:0:"],
        # Root: the agent loads BPF programs and edits the node's rules with the
        # capabilities the chart grants; it never runs as a user of its own.
        "user": "0:0",
        "cmd": ["run"],
    },
    "operator": {
        "binary": "switchyard-operator",
        "description": "Switchyard operator: drives a cluster's Service dataplane "
        "between kube-proxy and eBPF, node by node.",
        # No CA bundle: kube-rs with rustls verifies the API server against the
        # kubeconfig's CA (in a pod, the service account's ca.crt); the system store
        # is only its fallback when no CA is given.
        "files": ["etc/os-release"],
        "symlinks": {},
        "passwd": [
            "root:x:0:0:root:/root:/usr/sbin/nologin",
            "nonroot:x:65532:65532:nonroot:/nonexistent:/usr/sbin/nologin",
        ],
        "group": ["root:x:0:", "nonroot:x:65532:"],
        # Numeric, so that `runAsNonRoot` can check it without reading /etc/passwd.
        "user": "65532:65532",
        "cmd": [],
    },
}

# Directories every container expects to mount over or write to.
EMPTY_DIRECTORIES = {"dev": 0o755, "proc": 0o555, "sys": 0o555, "run": 0o755, "tmp": 0o1777}


class ImageError(Exception):
    pass


class Entry:
    """One file of a layer: a regular file (from `source` or `data`), a symlink or a
    directory."""

    def __init__(self, kind, mode, source=None, data=None, linkname="", mtime=None):
        self.kind = kind
        self.mode = mode
        self.source = source
        self.data = data
        self.linkname = linkname
        self.mtime = mtime


class Packages:
    """The unpacked packages: which package holds each path."""

    def __init__(self, packages_file, debs_directory):
        self.versions = {}
        self.debs = {}
        self.owner = {}
        with open(packages_file, encoding="utf-8") as lines:
            for line in lines:
                package, version, architecture, deb = line.rstrip("\n").split("\t")
                self.versions[package] = (version, architecture)
                self.debs[package] = deb
        for package in sorted(self.versions):
            root = os.path.join(debs_directory, package)
            for directory, subdirectories, files in os.walk(root):
                subdirectories.sort()
                for name in sorted(subdirectories) + sorted(files):
                    path = os.path.join(directory, name)
                    if os.path.isdir(path) and not os.path.islink(path):
                        continue
                    relative = os.path.relpath(path, root)
                    if relative in self.owner and self.owner[relative][0] != package:
                        raise ImageError(
                            f"{relative} is in both {self.owner[relative][0]} and {package}"
                        )
                    self.owner[relative] = (package, path)

    def glob(self, pattern):
        matches = sorted(path for path in self.owner if fnmatch.fnmatchcase(path, pattern))
        if not matches:
            raise ImageError(f"no package holds {pattern}")
        return matches

    def control(self, package):
        fields = subprocess.run(
            ["dpkg-deb", "--field", self.debs[package], "Package", "Source", "Version", "Architecture"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        return fields.rstrip("\n") + "\nStatus: install ok installed\n"


class Image:
    def __init__(self, packages, epoch):
        self.packages = packages
        self.epoch = epoch
        self.base = {}
        self.used_packages = set()

    def take(self, relative):
        """Adds a path from the packages, following symlinks (in any component)."""
        parts = relative.split("/")
        for index in range(1, len(parts) + 1):
            prefix = "/".join(parts[:index])
            if prefix not in self.packages.owner:
                continue
            package, source = self.packages.owner[prefix]
            if os.path.islink(source):
                target = os.readlink(source)
                self.add_package_file(prefix, package, source)
                if target.startswith("/"):
                    resolved = os.path.normpath(target.lstrip("/"))
                else:
                    resolved = os.path.normpath(os.path.join(os.path.dirname(prefix), target))
                rest = parts[index:]
                return self.take("/".join([resolved, *rest]) if rest else resolved)
            if index == len(parts):
                self.add_package_file(prefix, package, source)
                return prefix
        raise ImageError(f"no package holds {relative}")

    def add_package_file(self, relative, package, source):
        info = os.lstat(source)
        if stat.S_ISLNK(info.st_mode):
            entry = Entry("symlink", 0o777, linkname=os.readlink(source), mtime=info.st_mtime)
        elif stat.S_ISREG(info.st_mode):
            entry = Entry("file", stat.S_IMODE(info.st_mode), source=source, mtime=info.st_mtime)
        else:
            raise ImageError(f"{relative} in {package} is neither a file nor a symlink")
        self.base[relative] = entry
        self.used_packages.add(package)

    def add_libraries(self, elf_path, described):
        """Takes every shared library (and the loader) `elf_path` needs, recursively."""
        pending = [(elf_path, described)]
        seen = set()
        while pending:
            path, name = pending.pop()
            if path in seen:
                continue
            seen.add(path)
            interpreter, needed = read_dynamic_section(path)
            wanted = [interpreter.lstrip("/")] if interpreter else []
            for library in needed:
                found = next(
                    (
                        f"{directory}/{library}"
                        for directory in LIBRARY_DIRECTORIES
                        if f"{directory}/{library}" in self.packages.owner
                    ),
                    None,
                )
                if found is None:
                    raise ImageError(f"{name} needs {library}, which no listed package holds")
                wanted.append(found)
            for relative in wanted:
                resolved = self.take(relative)
                pending.append((self.packages.owner[resolved][1], resolved))

    def add_package_records(self):
        """Each package's copyright, and a dpkg status record for scanners
        (the distroless layout: /var/lib/dpkg/status.d/NAME)."""
        for package in sorted(self.used_packages):
            self.take(f"usr/share/doc/{package}/copyright")
        for package in sorted(self.used_packages):
            self.base[f"var/lib/dpkg/status.d/{package}"] = Entry(
                "file", 0o644, data=self.packages.control(package).encode()
            )


def read_dynamic_section(path):
    """The ELF interpreter and DT_NEEDED libraries of `path` (none for a non-ELF file)."""
    with open(path, "rb") as handle:
        if handle.read(4) != b"\x7fELF":
            return None, []
    output = subprocess.run(
        ["readelf", "--wide", "--dynamic", "--program-headers", path],
        check=True,
        capture_output=True,
        text=True,
        env={"LC_ALL": "C", "PATH": os.environ["PATH"]},
    ).stdout
    interpreter = None
    needed = []
    for line in output.splitlines():
        if "Requesting program interpreter:" in line:
            interpreter = line.split(":", 1)[1].strip().rstrip("]").strip()
        elif "(NEEDED)" in line:
            needed.append(line.split("[", 1)[1].rstrip("]"))
    return interpreter, needed


def with_parents(entries):
    """Adds each missing parent directory (0755), so that every path has its parents."""
    complete = dict(entries)
    for path in entries:
        parent = os.path.dirname(path)
        while parent and parent not in complete:
            complete[parent] = Entry("directory", 0o755)
            parent = os.path.dirname(parent)
    return complete


def layer_tar(entries, epoch):
    """The layer, uncompressed: entries sorted by path, owned by uid/gid 0 with no
    user or group names, mtimes clamped to `epoch`."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for path, entry in sorted(with_parents(entries).items()):
            info = tarfile.TarInfo(path)
            info.mode = entry.mode
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            mtime = entry.mtime if entry.mtime is not None else epoch
            info.mtime = min(int(mtime), epoch)
            if entry.kind == "directory":
                info.type = tarfile.DIRTYPE
                archive.addfile(info)
            elif entry.kind == "symlink":
                info.type = tarfile.SYMTYPE
                info.linkname = entry.linkname
                archive.addfile(info)
            else:
                data = entry.data
                if data is None:
                    with open(entry.source, "rb") as source:
                        data = source.read()
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def gzipped(data):
    buffer = io.BytesIO()
    # zlib's default level: level 9 takes twice the time for about 1% less.
    with gzip.GzipFile(filename="", mode="wb", compresslevel=6, fileobj=buffer, mtime=0) as compressed:
        compressed.write(data)
    return buffer.getvalue()


def canonical_json(value):
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def sha256(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


def write_archive(output, blobs, index, epoch):
    """The OCI image layout as one tar: oci-layout, index.json and blobs/sha256/*."""
    files = {
        "oci-layout": canonical_json({"imageLayoutVersion": "1.0.0"}),
        "index.json": canonical_json(index),
    }
    for digest, data in blobs.items():
        files["blobs/sha256/" + digest.split(":", 1)[1]] = data
    entries = {path: Entry("file", 0o644, data=data) for path, data in files.items()}
    layout = layer_tar(entries, epoch)
    temporary = output + ".partial"
    with open(temporary, "wb") as handle:
        handle.write(layout)
    os.replace(temporary, output)
    return len(layout)


def build(arguments):
    epoch = int(os.environ["SOURCE_DATE_EPOCH"])
    created = datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    spec = IMAGES[arguments.image]
    with open(arguments.workspace_manifest, "rb") as manifest:
        workspace = tomllib.load(manifest)["workspace"]["package"]
    packages = Packages(arguments.packages, arguments.debs)
    image = Image(packages, epoch)

    binary_name = spec["binary"]
    binary_source = os.path.join(arguments.binaries, binary_name)
    binary_path = f"usr/local/bin/{binary_name}"
    application = {binary_path: Entry("file", 0o755, source=binary_source, mtime=os.stat(binary_source).st_mtime)}

    elf_files = [(binary_source, binary_name)]
    for pattern in spec["files"]:
        for relative in packages.glob(pattern):
            resolved = image.take(relative)
            elf_files.append((packages.owner[resolved][1], resolved))
    for path, described in elf_files:
        image.add_libraries(path, described)
    image.add_package_records()
    for link, target in spec["symlinks"].items():
        image.base[link] = Entry("symlink", 0o777, linkname=target)
    image.base["etc/passwd"] = Entry("file", 0o644, data=("\n".join(spec["passwd"]) + "\n").encode())
    image.base["etc/group"] = Entry("file", 0o644, data=("\n".join(spec["group"]) + "\n").encode())
    for directory, mode in EMPTY_DIRECTORIES.items():
        image.base[directory] = Entry("directory", mode)

    used = sorted(image.used_packages)
    layers = [
        (
            image.base,
            "Debian bookworm files: " + ", ".join(f"{p} {packages.versions[p][0]}" for p in used),
        ),
        (application, f"{binary_path} {arguments.version} ({arguments.revision})"),
    ]
    blobs = {}
    layer_descriptors = []
    diff_ids = []
    history = []
    unpacked_size = 0
    for entries, created_by in layers:
        uncompressed = layer_tar(entries, epoch)
        unpacked_size += sum(
            len(entry.data) if entry.data is not None else os.path.getsize(entry.source)
            for entry in entries.values()
            if entry.kind == "file"
        )
        compressed = gzipped(uncompressed)
        digest = sha256(compressed)
        blobs[digest] = compressed
        diff_ids.append(sha256(uncompressed))
        layer_descriptors.append(
            {
                "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                "digest": digest,
                "size": len(compressed),
            }
        )
        history.append({"created": created, "created_by": f"images/build.sh: {created_by}"})

    labels = {
        "org.opencontainers.image.title": f"switchyard-{arguments.image}",
        "org.opencontainers.image.description": spec["description"],
        "org.opencontainers.image.version": arguments.version,
        "org.opencontainers.image.revision": arguments.revision,
        "org.opencontainers.image.created": created,
        "org.opencontainers.image.source": workspace["repository"],
        "org.opencontainers.image.licenses": workspace["license"],
    }
    config = {
        "architecture": "amd64",
        "os": "linux",
        "created": created,
        "config": {
            "User": spec["user"],
            "Env": [f"PATH={PATH}"],
            "Entrypoint": [f"/{binary_path}"],
            "WorkingDir": "/",
            "Labels": labels,
        },
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        "history": history,
    }
    if spec["cmd"]:
        config["config"]["Cmd"] = spec["cmd"]
    config_bytes = canonical_json(config)
    blobs[sha256(config_bytes)] = config_bytes
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": sha256(config_bytes),
            "size": len(config_bytes),
        },
        "layers": layer_descriptors,
        "annotations": labels,
    }
    manifest_bytes = canonical_json(manifest)
    blobs[sha256(manifest_bytes)] = manifest_bytes
    name = f"{arguments.registry}/switchyard-{arguments.image}:{arguments.version}"
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": sha256(manifest_bytes),
                "size": len(manifest_bytes),
                "platform": {"architecture": "amd64", "os": "linux"},
                # containerd (`ctr images import`, `kind load image-archive`) names the
                # image from the first; skopeo and umoci select it by the second.
                "annotations": {
                    "io.containerd.image.name": name,
                    "org.opencontainers.image.ref.name": arguments.version,
                },
            }
        ],
    }
    archive_size = write_archive(arguments.output, blobs, index, epoch)
    print(
        f"images: {os.path.relpath(arguments.output)}: {name}, "
        f"{archive_size / 1e6:.1f} MB archive, {unpacked_size / 1e6:.1f} MB unpacked, "
        f"{len(image.base) + len(application)} files and links, manifest {sha256(manifest_bytes)}"
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--image", choices=sorted(IMAGES), required=True)
    parser.add_argument("--packages", required=True, help="package<TAB>version<TAB>arch<TAB>deb lines")
    parser.add_argument("--debs", required=True, help="one unpacked directory per package")
    parser.add_argument("--binaries", required=True)
    parser.add_argument("--version", required=True)
    parser.add_argument("--revision", required=True)
    parser.add_argument("--registry", required=True)
    parser.add_argument("--workspace-manifest", required=True)
    parser.add_argument("--output", required=True)
    arguments = parser.parse_args()
    try:
        build(arguments)
    except ImageError as error:
        print(f"images: failed to assemble the {arguments.image} image: {error}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
