#!/usr/bin/env bash
# `make e2e-operator-smoke`: only the operator's own cluster tests (operator/tests/cluster.rs:
# leader election, CRD self-apply, Events on 1.20, Preflight) on a 3-node cluster of their
# own, for a quick loop while working on the operator. `make e2e-operator` runs them too,
# on the migration scenarios' cluster. Prints step timings.
set -euo pipefail
cd "$(dirname "$0")/../.."

SUITE=e2e-operator-smoke
export SWITCHYARD_E2E_STATE=${SWITCHYARD_E2E_STATE:-/var/lib/switchyard-e2e-operator}
export SWITCHYARD_E2E_LAST_LOGS=${SWITCHYARD_E2E_LAST_LOGS:-/tmp/switchyard-e2e-operator-last-logs}
# shellcheck source=e2e/scripts/suite.sh
source e2e/scripts/suite.sh

bash e2e/scripts/build-kubernetes.sh
step "kubernetes components"
"$CARGO" build --locked --quiet -p switchyard-e2e --bins
"$CARGO" test --locked --quiet --no-run -p switchyard-operator --test cluster
step "pod runner, operator and its test"
cluster_up
run_tests switchyard-operator cluster "operator tests"
cluster_down
