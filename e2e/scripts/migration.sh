#!/usr/bin/env bash
# `make e2e-migration`: the migration scenarios (e2e/tests/migration_scenarios.rs) on one
# 3-node cluster with its own state directory: build the agent, the operator and the
# tests, start the cluster with the chart's images mapped to the built binaries, run the
# scenarios inside it, tear it down and check nothing is left. Prints each step's time.
set -euo pipefail
cd "$(dirname "$0")/../.."

CARGO=${CARGO:-cargo}
export SWITCHYARD_E2E_STATE=${SWITCHYARD_E2E_STATE:-/var/lib/switchyard-e2e-migration}
export SWITCHYARD_E2E_LAST_LOGS=${SWITCHYARD_E2E_LAST_LOGS:-/tmp/switchyard-e2e-migration-last-logs}
target_directory=${CARGO_TARGET_DIR:-$PWD/target}

milliseconds() { echo $(( $(date +%s%N) / 1000000 )); }
seconds_since() { local elapsed=$(( $(milliseconds) - $1 )); printf '%d.%d' $((elapsed / 1000)) $((elapsed % 1000 / 100)); }
started=$(milliseconds)
step_started=$started
step() {
  printf 'e2e-migration: %-30s %6s s\n' "$1" "$(seconds_since "$step_started")" >&2
  step_started=$(milliseconds)
}

images=$(mktemp)
cleanup() {
  local status=$?
  e2e/cluster down >/dev/null 2>&1 || true
  rm -f "$images"
  if [ "$status" -ne 0 ]; then
    echo "e2e-migration: FAILED (logs of the cluster: $SWITCHYARD_E2E_LAST_LOGS)" >&2
  fi
}
trap cleanup EXIT

bash e2e/scripts/build-kubernetes.sh
step "kubernetes components"
"$CARGO" build --locked --quiet -p switchyard-agent -p switchyard-operator --bins
"$CARGO" build --locked --quiet -p switchyard-e2e --bins --tests
step "agent, operator and e2e crate"
cat > "$images" <<IMAGES
ghcr.io/switchyard/switchyard-agent:* $target_directory/debug/switchyard-agent
ghcr.io/switchyard/switchyard-operator:* $target_directory/debug/switchyard-operator
IMAGES
# A cluster an interrupted run of this suite left behind (own state directory).
e2e/cluster down >/dev/null 2>&1 || true
SWITCHYARD_E2E_IMAGES=$images e2e/cluster up --nodes 3
step "cluster up (3 nodes)"
e2e/cluster exec "$CARGO" test --locked --offline --quiet -p switchyard-e2e --test migration_scenarios \
  -- --ignored --nocapture --test-threads=1 ${SWITCHYARD_E2E_MIGRATION_TESTS:-}
step "migration scenarios"
e2e/cluster down
e2e/cluster verify-clean
step "cluster down, verified clean"
printf 'e2e-migration: %-30s %6s s\n' "total" "$(seconds_since "$started")" >&2
