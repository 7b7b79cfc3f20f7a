#!/usr/bin/env bash
# `make e2e-smoke`: build or reuse the components, start a 3-node cluster (own state
# directory), run the smoke test inside it, tear it down and check nothing is left.
# Prints how long each step took.
set -euo pipefail
cd "$(dirname "$0")/../.."

SUITE=e2e-smoke
export SWITCHYARD_E2E_STATE=${SWITCHYARD_E2E_STATE:-/var/lib/switchyard-e2e-smoke}
export SWITCHYARD_E2E_LAST_LOGS=${SWITCHYARD_E2E_LAST_LOGS:-/tmp/switchyard-e2e-smoke-last-logs}
# shellcheck source=e2e/scripts/suite.sh
source e2e/scripts/suite.sh

bash e2e/scripts/build-kubernetes.sh
step "kubernetes components"
"$CARGO" build --locked --quiet -p switchyard-e2e --bin switchyard-e2e-pod-runner --test smoke
step "e2e crate"
# The probe image of the smoke test's Deployment joins the image table.
cat e2e/manifests/smoke-images.conf > "$images"
# The test talks to the API server and opens connections, so it runs inside the
# cluster's private namespaces.
run_scenarios smoke "smoke test"
