#!/usr/bin/env bash
# `make e2e-operator-smoke`: the operator against a real Kubernetes 1.20 API server.
# Starts a 3-node cluster (e2e/cluster), runs operator/tests/cluster.rs inside its
# private namespaces (agents simulated by the test, the operator binary as a child
# process), tears the cluster down and checks nothing is left. Prints step timings.
set -euo pipefail
cd "$(dirname "$0")/../.."

CARGO=${CARGO:-cargo}
milliseconds() { echo $(( $(date +%s%N) / 1000000 )); }
seconds_since() { local elapsed=$(( $(milliseconds) - $1 )); printf '%d.%d' $((elapsed / 1000)) $((elapsed % 1000 / 100)); }
started=$(milliseconds)
step_started=$started
step() {
  printf 'e2e-operator-smoke: %-34s %6s s\n' "$1" "$(seconds_since "$step_started")" >&2
  step_started=$(milliseconds)
}

# `e2e/cluster down` without a state directory falls back to the namespace list kept
# beside the last logs; once those namespaces are gone their inode numbers can be reused
# by another cluster on this machine (other suites run clusters with their own state
# directories), so a stale list must never be acted on: remove it before `up`, and run
# `down` on failure only while this run's cluster is up.
last_logs=${SWITCHYARD_E2E_LAST_LOGS:-/tmp/switchyard-e2e-last-logs}
cluster_is_up=0
images=
cleanup() {
  local status=$?
  [ -n "$images" ] && rm -f "$images"
  if [ "$cluster_is_up" -eq 1 ]; then
    e2e/cluster down >/dev/null 2>&1 || true
  fi
  if [ "$status" -ne 0 ]; then
    echo "e2e-operator-smoke: FAILED (cluster logs: ${SWITCHYARD_E2E_LAST_LOGS:-/tmp/switchyard-e2e-last-logs}; operator logs: ${TMPDIR:-/tmp}/switchyard-operator-test-*.log)" >&2
  fi
}
trap cleanup EXIT

bash e2e/scripts/build-kubernetes.sh
step "kubernetes components"
"$CARGO" build --locked --quiet -p switchyard-e2e --bins
"$CARGO" test --locked --quiet --no-run -p switchyard-operator --test cluster
step "pod runner, operator and its test"
# The pod runner runs this build of the operator for the chart's operator image.
images=$(mktemp)
echo "ghcr.io/switchyard/switchyard-operator:* ${CARGO_TARGET_DIR:-$PWD/target}/debug/switchyard-operator" > "$images"
export SWITCHYARD_E2E_IMAGES=$images
rm -f "$last_logs/namespaces"
cluster_is_up=1
e2e/cluster up --nodes 3
step "cluster up (3 nodes)"
e2e/cluster exec "$CARGO" test --locked --offline --quiet -p switchyard-operator --test cluster -- --ignored --test-threads=1 --nocapture
step "operator tests"
e2e/cluster down
cluster_is_up=0
rm -f "$last_logs/namespaces"
e2e/cluster verify-clean
step "cluster down, verified clean"
printf 'e2e-operator-smoke: %-34s %6s s\n' "total" "$(seconds_since "$started")" >&2
