#!/usr/bin/env bash
# `make demo`: builds what it needs (or reuses it), starts the local 3-node cluster
# (e2e/cluster, inside its private network namespace) with the chart's images mapped to
# the local binaries, and runs switchyard-demo inside it: kube-proxy serving a demo
# Service under traffic, `helm install`, `mode: Ebpf`, the transition live, a summary.
# The cluster stays up afterwards; `make demo-down` removes it.
set -euo pipefail
cd "$(dirname "$0")/../.."

CARGO=${CARGO:-cargo}
target_directory=${CARGO_TARGET_DIR:-$PWD/target}
images=${SWITCHYARD_E2E_STATE:-/var/lib/switchyard-e2e}.images.conf

echo "==> building (or reusing) Kubernetes 1.20, helm, the agent, the operator and the pod runner"
bash e2e/scripts/build-kubernetes.sh
"$CARGO" build --locked --quiet -p switchyard-agent -p switchyard-operator --bins
"$CARGO" build --locked --quiet -p switchyard-e2e --bins
# The chart's images, run by the pod runner as the binaries just built.
cat > "$images" <<IMAGES
ghcr.io/switchyard/switchyard-agent:* $target_directory/debug/switchyard-agent
ghcr.io/switchyard/switchyard-operator:* $target_directory/debug/switchyard-operator
IMAGES
echo "==> starting the local cluster (3 nodes, real kube-proxy; a demo cluster left up before is removed)"
e2e/cluster down >/dev/null 2>&1 || true
SWITCHYARD_E2E_IMAGES=$images e2e/cluster up --nodes 3
e2e/cluster exec "$target_directory/debug/switchyard-demo"
