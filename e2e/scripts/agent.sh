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
"$CARGO" build --locked --quiet -p switchyard-agent -p switchyard-operator --bins
"$CARGO" build --locked --quiet -p switchyard-e2e --bins --tests
step "agent and e2e crate"
# The agent's pods run from its image (an OCI archive around the binary just built).
: > "$images"
bash e2e/scripts/images.sh "$images" switchyard/agent: ghcr.io/switchyard/switchyard-agent:
step "images"
cluster_up
run_tests switchyard-e2e agent_scenarios "agent scenarios" "${SWITCHYARD_E2E_AGENT_TESTS:-}"
# The agent's privileges (e2e/tests/agent_privileges.rs): what the kernel says of the running
# agents, and an agent without NET_ADMIN failing as on a real node (then back).
run_tests switchyard-e2e agent_privileges "agent privileges" agent
cluster_down
