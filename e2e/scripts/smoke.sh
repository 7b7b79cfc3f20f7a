#!/usr/bin/env bash
# `make e2e-smoke`: build or reuse the components, start a 3-node cluster, run
# the smoke test inside it, tear it down and check nothing is left. Prints how
# long each step took.
set -euo pipefail
cd "$(dirname "$0")/../.."

CARGO=${CARGO:-cargo}
milliseconds() { echo $(( $(date +%s%N) / 1000000 )); }
seconds_since() { local elapsed=$(( $(milliseconds) - $1 )); printf '%d.%d' $((elapsed / 1000)) $((elapsed % 1000 / 100)); }
started=$(milliseconds)
step_started=$started
step() {
  printf 'e2e-smoke: %-30s %6s s\n' "$1" "$(seconds_since "$step_started")" >&2
  step_started=$(milliseconds)
}

# Only a cluster this run started is torn down: another one with the same state
# directory belongs to someone else.
owns_cluster=0
cleanup() {
  local status=$?
  if [ "$owns_cluster" = 1 ]; then
    e2e/cluster down >/dev/null 2>&1 || true
  fi
  if [ "$status" -ne 0 ]; then
    local state=${SWITCHYARD_E2E_STATE:-/var/lib/switchyard-e2e}
    echo "e2e-smoke: FAILED (logs of the cluster: ${SWITCHYARD_E2E_LAST_LOGS:-/tmp/$(basename "$state")-last-logs})" >&2
  fi
}
trap cleanup EXIT

bash e2e/scripts/build-kubernetes.sh
step "kubernetes components"
"$CARGO" build --locked -p switchyard-e2e --bin switchyard-e2e-pod-runner --test smoke --quiet
step "e2e crate"
if e2e/cluster status >/dev/null 2>&1; then
  echo "e2e-smoke: a cluster with state ${SWITCHYARD_E2E_STATE:-/var/lib/switchyard-e2e} is running; stop it or set SWITCHYARD_E2E_STATE to another directory" >&2
  exit 1
fi
owns_cluster=1
# The probe image of the smoke test's Deployment joins the image table.
SWITCHYARD_E2E_IMAGES="$PWD/e2e/manifests/smoke-images.conf" e2e/cluster up --nodes 3
step "cluster up (3 nodes)"
# The test talks to the API server and opens connections, so it runs inside
# the cluster's private namespaces.
e2e/cluster exec "$CARGO" test --locked --offline --quiet -p switchyard-e2e --test smoke -- --ignored --test-threads=1 --nocapture
step "smoke test"
e2e/cluster down
e2e/cluster verify-clean
step "cluster down, verified clean"
printf 'e2e-smoke: %-30s %6s s\n' "total" "$(seconds_since "$started")" >&2
