#!/usr/bin/env bash
# The e2e suites' images: the OCI archives of the agent and the operator (images/build.sh)
# around the debug binaries the suites just built, so the pod runner runs Switchyard's pods
# from their images as a kubelet would (e2e/src/pod_runner/container.rs).
#
# Usage: e2e/scripts/images.sh TABLE_FILE IMAGE_NAME_PREFIX...
#   Appends `PREFIX* oci-archive:ARCHIVE` to TABLE_FILE for each prefix naming the agent
#   (ending in `switchyard-agent:` or `agent:`) or the operator image.
#
# The archives are built once per content: under target/images/e2e/KEY, where KEY hashes
# both binaries and the image build's own files; the build time and revision are fixed
# (SOURCE_DATE_EPOCH=0, revision `e2e`), so the same binaries give the same archives and
# the pod runner's unpacked root filesystems (cached by manifest digest) are reused too.
# Only the two newest keys are kept.
set -euo pipefail
cd "$(dirname "$0")/../.."

[ $# -ge 2 ] || { echo "usage: e2e/scripts/images.sh TABLE_FILE PREFIX..." >&2; exit 2; }
table=$1
shift
target_directory=${CARGO_TARGET_DIR:-$PWD/target}
binaries="$target_directory/debug"
for binary in switchyard-agent switchyard-operator; do
  [ -x "$binaries/$binary" ] || { echo "e2e images: no $binaries/$binary (build it first)" >&2; exit 1; }
done
for tool in crun umoci; do
  command -v "$tool" >/dev/null || { echo "e2e images: no $tool (run scripts/setup.sh)" >&2; exit 1; }
done

key=$(cat "$binaries/switchyard-agent" "$binaries/switchyard-operator" \
  images/build.sh images/assemble.py Cargo.toml | sha256sum | cut -c1-16)
root="$target_directory/images/e2e"
output="$root/$key"
if [ -f "$output/switchyard-agent.oci.tar" ] && [ -f "$output/switchyard-operator.oci.tar" ]; then
  echo "e2e images: reusing $output" >&2
else
  rm -rf "$output" "$output.partial"
  SOURCE_DATE_EPOCH=0 SWITCHYARD_IMAGE_REVISION=e2e \
    bash images/build.sh --binaries "$binaries" --output-dir "$output.partial" >&2
  rm -rf "$output.partial/work"
  mv "$output.partial" "$output"
fi
# The two newest builds stay (a suite's cluster may still use the previous one).
# shellcheck disable=SC2012 # names are hex keys
# (grep finds nothing on the first build: not a failure under pipefail.)
ls -1t "$root" | { grep -v -e "^$key\$" -e '\.partial$' || true; } | tail -n +2 | while read -r old; do
  rm -rf "${root:?}/$old"
done

for prefix in "$@"; do
  case "$prefix" in
    *switchyard-agent:|*agent:) archive="$output/switchyard-agent.oci.tar" ;;
    *switchyard-operator:|*operator:) archive="$output/switchyard-operator.oci.tar" ;;
    *) echo "e2e images: which image is $prefix?" >&2; exit 2 ;;
  esac
  echo "$prefix* oci-archive:$archive" >> "$table"
done
