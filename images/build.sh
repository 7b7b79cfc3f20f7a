#!/usr/bin/env bash
# Builds the OCI image archives of the agent and the operator with Debian's tools and
# packages only (no container engine, no registry):
#   target/images/switchyard-agent.oci.tar
#   target/images/switchyard-operator.oci.tar
# The release binaries come from `cargo build --release` (or from --binaries DIR);
# the C runtime and the agent's netfilter tools come from Debian's .debs, downloaded
# with apt-get into a cache keyed by package version and unpacked with dpkg-deb. Only
# the files the images need are taken (images/assemble.py lists them and follows
# every ELF file's shared libraries); the layers and the archive are written in a
# fixed order with fixed owners and clamped times, so two builds of the same commit
# give the same bytes. See docs/images.md.
#
# Usage: images/build.sh [--binaries DIR] [--output-dir DIR]
#   --binaries DIR    take switchyard-agent and switchyard-operator from DIR instead of
#                     building them (the reproducibility test reuses one build's binaries).
#   --output-dir DIR  write the archives (and the work directory) there, not in
#                     target/images.
# Environment:
#   SOURCE_DATE_EPOCH            image times (default: the commit time of HEAD)
#   SWITCHYARD_IMAGE_REVISION    the revision label (default: `git rev-parse HEAD`)
#   SWITCHYARD_IMAGE_REGISTRY    the name prefix in the archives (default ghcr.io/switchyard,
#                                as charts/switchyard/values.yaml)
#   SWITCHYARD_CACHE             cache root (default ~/.cache/switchyard)
set -euo pipefail
cd "$(dirname "$0")/.."
repository_root=$PWD

log() { printf 'images: %s\n' "$*" >&2; }

binaries_dir=""
output_dir="$repository_root/target/images"
while [[ $# -gt 0 ]]; do
    case "$1" in
        --binaries) binaries_dir=$(realpath "$2"); shift 2 ;;
        --output-dir) output_dir=$(realpath -m "$2"); shift 2 ;;
        *) echo "usage: images/build.sh [--binaries DIR] [--output-dir DIR]" >&2; exit 2 ;;
    esac
done

# The build's own tools, installed the way scripts/setup.sh installs its packages.
# Debian's python3 (not a pyenv one): its tarfile, json and zlib write the bytes, so
# the same Debian release gives the same archives.
BUILD_PACKAGES=(python3 dpkg binutils apt)
missing=()
for package in "${BUILD_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'install ok installed' || missing+=("$package")
done
if [[ ${#missing[@]} -gt 0 ]]; then
    log "installing Debian packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
python=/usr/bin/python3

# Debian packages the images take files from (assemble.py says which files). The
# agent runs iptables and ip6tables of both backends (save/restore, and plain
# `iptables` for its masquerade rule), nft, and ip (node-agent/src/kube_proxy/system.rs,
# standalone/interfaces.rs, standalone/masquerade.rs); the rest are their libraries,
# the C runtime, /etc/protocols and /etc/services (netbase: iptables resolves
# protocol names) and /usr/lib/os-release (base-files: scanners read it).
# gcc-12-base holds libgcc-s1's copyright (its doc directory is a symlink there).
DEBIAN_IMAGE_PACKAGES=(
    base-files netbase libc6 libgcc-s1 gcc-12-base
    iptables libxtables12 libip4tc2 libip6tc2 libmnl0 libnftnl11 libnetfilter-conntrack3 libnfnetlink0
    nftables libnftables1 libedit2 libjansson4 libgmp10 libtinfo6 libbsd0 libmd0
    iproute2 libbpf1 libelf1 libcap2 zlib1g
)

cache_root="${SWITCHYARD_CACHE:-$HOME/.cache/switchyard}"
deb_cache="$cache_root/images/debs"
mkdir -p "$deb_cache"
work_dir="$output_dir/work"

export SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct)}"
revision="${SWITCHYARD_IMAGE_REVISION:-$(git rev-parse HEAD)}"
registry="${SWITCHYARD_IMAGE_REGISTRY:-ghcr.io/switchyard}"

# One .deb per package at apt's candidate version, cached under its name, version and
# architecture and checked against the archive's SHA256 (a cached file is reused only
# while it is still the candidate with that checksum). One apt-cache call for all of
# them: each call reads apt's whole package cache.
candidates() {
    apt-cache show --no-all-versions "${DEBIAN_IMAGE_PACKAGES[@]}" 2>/dev/null | awk '
        /^Package: / {package = $2}
        /^Version: / {version = $2}
        /^Architecture: / {architecture = $2}
        /^SHA256: / {sha256 = $2}
        /^$/ {if (package != "") print package "\t" version "\t" architecture "\t" sha256; package = ""}
        END {if (package != "") print package "\t" version "\t" architecture "\t" sha256}'
}
candidate_list=$(candidates)
if [[ $(wc -l <<<"$candidate_list") -lt ${#DEBIAN_IMAGE_PACKAGES[@]} ]]; then
    log "apt lacks some package lists; running apt-get update"
    apt-get update -qq
    candidate_list=$(candidates)
fi
packages_list="$work_dir/packages.tsv"
rm -rf "$work_dir"
mkdir -p "$work_dir/debs"
# package, version, architecture, sha256, cached file: one line per package.
wanted=()
to_download=()
for package in "${DEBIAN_IMAGE_PACKAGES[@]}"; do
    IFS=$'\t' read -r _ version architecture sha256 < <(awk -v package="$package" -F'\t' '$1 == package' <<<"$candidate_list") || true
    if [[ -z "${version:-}" || -z "${architecture:-}" || -z "${sha256:-}" ]]; then
        echo "images: apt knows no candidate of $package" >&2
        exit 1
    fi
    deb="$deb_cache/${package}_${version//:/%3a}_${architecture}.deb"
    wanted+=("$package"$'\t'"$version"$'\t'"$architecture"$'\t'"$sha256"$'\t'"$deb")
    if [[ ! -f "$deb" ]] || ! echo "$sha256  $deb" | sha256sum --check --status; then
        to_download+=("$package=$version")
    fi
    unset version architecture sha256
done
# One apt-get call for all missing packages (each call reads apt's whole cache).
if [[ ${#to_download[@]} -gt 0 ]]; then
    log "downloading ${to_download[*]}"
    (cd "$deb_cache" && apt-get download -qq -o APT::Sandbox::User=root "${to_download[@]}")
fi
for line in "${wanted[@]}"; do
    IFS=$'\t' read -r package version architecture sha256 deb <<<"$line"
    echo "$sha256  $deb" | sha256sum --check --status \
        || { echo "images: $deb does not match the archive's SHA256 $sha256" >&2; exit 1; }
    # Each package in a directory of its own, so assemble.py knows each file's package.
    dpkg-deb -x "$deb" "$work_dir/debs/$package"
    printf '%s\t%s\t%s\t%s\n' "$package" "$version" "$architecture" "$deb" >>"$packages_list"
done

if [[ -z "$binaries_dir" ]]; then
    log "building the release binaries"
    cargo build --locked --release -p switchyard-agent -p switchyard-operator
    binaries_dir="${CARGO_TARGET_DIR:-$repository_root/target}/release"
fi
# A copy of the binaries the images hold: a later build (images/test.sh) reuses exactly
# these, whatever cargo builds meanwhile.
mkdir -p "$work_dir/binaries"
for binary in switchyard-agent switchyard-operator; do
    [[ -x "$binaries_dir/$binary" ]] || { echo "images: no $binary in $binaries_dir" >&2; exit 1; }
    cp --preserve=mode,timestamps "$binaries_dir/$binary" "$work_dir/binaries/$binary"
done
binaries_dir="$work_dir/binaries"

version=$(cargo metadata --no-deps --format-version 1 --locked \
    | "$python" -c 'import json, sys; print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"] == "switchyard-agent"))')

for image in agent operator; do
    "$python" images/assemble.py \
        --image "$image" \
        --packages "$packages_list" \
        --debs "$work_dir/debs" \
        --binaries "$binaries_dir" \
        --version "$version" \
        --revision "$revision" \
        --registry "$registry" \
        --workspace-manifest Cargo.toml \
        --output "$output_dir/switchyard-$image.oci.tar"
done
