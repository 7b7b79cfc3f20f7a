#!/usr/bin/env bash
# `make demo`: builds what it needs (or reuses it), starts the local 3-node cluster
# (e2e/cluster, inside its private network namespace) with the chart's images mapped to
# the local binaries, and runs switchyard-demo inside it: kube-proxy serving a demo
# Service under traffic, `helm install`, `mode: Ebpf` and back to `mode: KubeProxy` with
# draining, each transition live, a summary per direction.
# The cluster stays up afterwards; `make demo-down` removes it.
#
# For tests (`make demo-check`):
#   SWITCHYARD_DEMO_SUMMARY=PATH  the summary is also written as JSON to PATH (a summary
#                                 left there before is removed first)
#   SWITCHYARD_DEMO_DOWN=1        the cluster is removed (and checked clean) afterwards,
#                                 whether the demo passed or not
#   SWITCHYARD_E2E_STATE=DIR      the cluster's state directory (default /var/lib/switchyard-e2e)
set -euo pipefail
cd "$(dirname "$0")/../.."

CARGO=${CARGO:-cargo}
target_directory=${CARGO_TARGET_DIR:-$PWD/target}
images=${SWITCHYARD_E2E_STATE:-/var/lib/switchyard-e2e}.images.conf
summary=${SWITCHYARD_DEMO_SUMMARY:-}
down=${SWITCHYARD_DEMO_DOWN:-0}
started=$(date +%s)
step_started=$started
# Each step's wall time (the suite's cost in `make test`).
step() {
  echo "demo: $1 in $(( $(date +%s) - step_started )) s"
  step_started=$(date +%s)
}

demo_arguments=()
if [ -n "$summary" ]; then
  # Absolute: the demo runs in the cluster's namespaces, from this directory, but be plain.
  case "$summary" in /*) ;; *) summary=$PWD/$summary ;; esac
  rm -f "$summary"
  demo_arguments+=(--summary "$summary")
fi
if [ "$down" = 1 ]; then
  demo_arguments+=(--cluster-removed-after)
  remove_cluster() {
    local status=$?
    echo "==> removing the cluster (SWITCHYARD_DEMO_DOWN=1)"
    e2e/cluster down >/dev/null 2>&1 || status=1
    e2e/cluster verify-clean || status=1
    rm -f "$images"
    step "cluster removed"
    echo "demo: $(( $(date +%s) - started )) s in all"
    exit "$status"
  }
  trap remove_cluster EXIT
fi

echo "==> building (or reusing) Kubernetes 1.20, helm, the agent, the operator and the pod runner"
bash e2e/scripts/build-kubernetes.sh
"$CARGO" build --locked --quiet -p switchyard-agent -p switchyard-operator --bins
"$CARGO" build --locked --quiet -p switchyard-e2e --bins
step "built or reused"
# The chart's pods, run by the pod runner from their images (OCI archives around the
# binaries just built), with their securityContext and volumes.
: > "$images"
bash e2e/scripts/images.sh "$images" ghcr.io/switchyard/switchyard-agent: ghcr.io/switchyard/switchyard-operator:
step "images"
echo "==> starting the local cluster (3 nodes, real kube-proxy; a demo cluster left up before is removed)"
e2e/cluster down >/dev/null 2>&1 || true
SWITCHYARD_E2E_IMAGES=$images e2e/cluster up --nodes 3
step "cluster up"
e2e/cluster exec "$target_directory/debug/switchyard-demo" "${demo_arguments[@]}"
step "demo there and back"
