#!/usr/bin/env bash
# `make e2e-operator` (also `make e2e-migration`): issue 6's seven scenarios with real agents
# under traffic (e2e/tests/migration_scenarios.rs), preceded by the operator's own cluster tests
# (operator/tests/cluster.rs: leader election, CRD self-apply, Events on 1.20, Preflight), on
# one 3-node cluster with its own state directory: build the agent, the operator and the tests,
# start the cluster with the chart's images mapped to the built binaries, run both inside it,
# tear it down and check nothing is left. Prints each step's time.
set -euo pipefail
cd "$(dirname "$0")/../.."

SUITE=e2e-operator
export SWITCHYARD_E2E_STATE=${SWITCHYARD_E2E_STATE:-/var/lib/switchyard-e2e-migration}
export SWITCHYARD_E2E_LAST_LOGS=${SWITCHYARD_E2E_LAST_LOGS:-/tmp/switchyard-e2e-migration-last-logs}
# shellcheck source=e2e/scripts/suite.sh
source e2e/scripts/suite.sh

bash e2e/scripts/build-kubernetes.sh
step "kubernetes components"
"$CARGO" build --locked --quiet -p switchyard-agent -p switchyard-operator --bins
"$CARGO" build --locked --quiet -p switchyard-e2e --bins --tests
"$CARGO" test --locked --quiet --no-run -p switchyard-operator --test cluster
step "agent, operator and tests"
# The chart's pods run from their images (OCI archives around the binaries just built).
: > "$images"
bash e2e/scripts/images.sh "$images" ghcr.io/switchyard/switchyard-agent: ghcr.io/switchyard/switchyard-operator:
step "images"
cluster_up
# SWITCHYARD_E2E_MIGRATION_TESTS=<filter> runs only the migration scenarios matching it (and the
# scenarios before them, which they start from).
if [ -z "${SWITCHYARD_E2E_MIGRATION_TESTS:-}" ]; then
  run_tests switchyard-operator cluster "operator cluster tests"
fi
run_tests switchyard-e2e migration_scenarios "migration scenarios (1-7)" "${SWITCHYARD_E2E_MIGRATION_TESTS:-}"
# What the kernel says of the chart's running pods (e2e/tests/agent_privileges.rs): agents hold
# exactly the capabilities the chart grants, the operator runs as its non-root user.
run_tests switchyard-e2e agent_privileges "running pods' privileges" running_switchyard
cluster_down
