#!/usr/bin/env bash
# `make e2e-migration`: the migration scenarios (e2e/tests/migration_scenarios.rs) on one
# 3-node cluster with its own state directory: build the agent, the operator and the
# tests, start the cluster with the chart's images mapped to the built binaries, run the
# scenarios inside it, tear it down and check nothing is left. Prints each step's time.
set -euo pipefail
cd "$(dirname "$0")/../.."

SUITE=e2e-migration
export SWITCHYARD_E2E_STATE=${SWITCHYARD_E2E_STATE:-/var/lib/switchyard-e2e-migration}
export SWITCHYARD_E2E_LAST_LOGS=${SWITCHYARD_E2E_LAST_LOGS:-/tmp/switchyard-e2e-migration-last-logs}
# shellcheck source=e2e/scripts/suite.sh
source e2e/scripts/suite.sh

bash e2e/scripts/build-kubernetes.sh
step "kubernetes components"
"$CARGO" build --locked --quiet -p switchyard-agent -p switchyard-operator --bins
"$CARGO" build --locked --quiet -p switchyard-e2e --bins --tests
step "agent, operator and e2e crate"
cat > "$images" <<IMAGES
ghcr.io/switchyard/switchyard-agent:* $target_directory/debug/switchyard-agent
ghcr.io/switchyard/switchyard-operator:* $target_directory/debug/switchyard-operator
IMAGES
run_scenarios migration_scenarios "migration scenarios" "${SWITCHYARD_E2E_MIGRATION_TESTS:-}"
