#!/usr/bin/env bash
# `make e2e-agent`: the node agent's scenarios (issue 5) on one 3-node cluster:
# build the agent and the tests, start the cluster with the agent image mapped
# to the built binary, run every scenario inside it (one at a time), tear it
# down and check nothing is left. Prints how long each step took.
set -euo pipefail
cd "$(dirname "$0")/../.."

SUITE=e2e-agent
# A state directory of its own, so this suite never meets another cluster.
export SWITCHYARD_E2E_STATE=${SWITCHYARD_E2E_STATE:-/var/lib/switchyard-e2e-agent}
export SWITCHYARD_E2E_LAST_LOGS=${SWITCHYARD_E2E_LAST_LOGS:-/tmp/switchyard-e2e-agent-last-logs}
# shellcheck source=e2e/scripts/suite.sh
source e2e/scripts/suite.sh

bash e2e/scripts/build-kubernetes.sh
step "kubernetes components"
"$CARGO" build --locked --quiet -p switchyard-agent --bins
"$CARGO" build --locked --quiet -p switchyard-e2e --bins --tests
step "agent and e2e crate"
echo "switchyard/agent:* $target_directory/debug/switchyard-agent" > "$images"
run_scenarios agent_scenarios "agent scenarios" "${SWITCHYARD_E2E_AGENT_TESTS:-}"
