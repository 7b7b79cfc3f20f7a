#!/usr/bin/env bash
# Idempotent set-up for a fresh Debian bookworm machine: everything `make test`,
# `make demo` and `make bench` need. Safe to run again; each step checks first.
set -euo pipefail

log() { printf 'setup: %s\n' "$*" >&2; }

BPF_LINKER_VERSION=0.13.0
CACHE_ROOT="${SWITCHYARD_CACHE:-$HOME/.cache/switchyard}"
mkdir -p "$CACHE_ROOT"

# Debian packages used by the tests: netns/veth tooling, iptables (both backends),
# nftables, conntrack, bpftool for inspecting attachments, openssl for the e2e CA, and the
# OCI runtime (crun) and image unpacker (umoci) with which the e2e pod runner runs
# Switchyard's pods from their images.
DEBIAN_PACKAGES=(iproute2 iptables nftables conntrack bpftool openssl rsync curl unzip python3 util-linux procps psmisc jq crun umoci)
missing=()
for package in "${DEBIAN_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'install ok installed' || missing+=("$package")
done
if [ "${#missing[@]}" -gt 0 ]; then
  log "installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The kernel programs build with the nightly toolchain and its rust-src.
if ! rustup toolchain list | grep -q '^nightly'; then
  log "installing the nightly toolchain"
  rustup toolchain install nightly --profile minimal
fi
if ! rustup component list --toolchain nightly --installed | grep -q '^rust-src'; then
  log "adding rust-src to nightly"
  rustup component add rust-src --toolchain nightly
fi

# bpf-linker must link against the same LLVM major as the nightly rustc, so it is
# built against the nightly's own libLLVM, exposed under a private prefix.
llvm_major=$(rustc +nightly -vV | sed -n 's/^LLVM version: \([0-9]*\).*/\1/p')
nightly_sysroot=$(rustc +nightly --print sysroot)
llvm_prefix="$CACHE_ROOT/llvm-nightly-$llvm_major"
# The nightly ships libLLVM-NN-rust-*.so as a linker script pointing at the real
# object libLLVM.so.NN.*: link against the real object, and keep its own name
# beside the symlink so the rpath finds its SONAME at run time.
nightly_llvm=$(ls "$nightly_sysroot"/lib/libLLVM.so."$llvm_major".* | head -n 1)
mkdir -p "$llvm_prefix/lib"
ln -sf "$nightly_llvm" "$llvm_prefix/lib/libLLVM.so"
ln -sf "$nightly_llvm" "$llvm_prefix/lib/$(basename "$nightly_llvm")"
linker_stamp="$CACHE_ROOT/bpf-linker-$BPF_LINKER_VERSION-llvm-$llvm_major.stamp"
if ! command -v bpf-linker >/dev/null 2>&1 || [ ! -f "$linker_stamp" ] \
   || ! bpf-linker --version 2>/dev/null | grep -q "$BPF_LINKER_VERSION"; then
  log "building bpf-linker $BPF_LINKER_VERSION against LLVM $llvm_major ($nightly_llvm)"
  LLVM_PREFIX="$llvm_prefix" LD_LIBRARY_PATH="$llvm_prefix/lib:${LD_LIBRARY_PATH:-}" \
    cargo install bpf-linker --locked --version "$BPF_LINKER_VERSION" --force \
      --no-default-features --features "llvm-$llvm_major"
  touch "$linker_stamp"
fi

# The BPF filesystem, where the agent pins maps, programs and links.
if ! mount | grep -q ' /sys/fs/bpf type bpf'; then
  mount -t bpf bpf /sys/fs/bpf 2>/dev/null || log "could not mount bpffs at /sys/fs/bpf"
fi
log "ready"
