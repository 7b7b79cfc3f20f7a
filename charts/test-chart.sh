#!/usr/bin/env bash
# Checks of the Helm chart that need no cluster: lint, deterministic rendering,
# the CRDs it ships equal the generated ones, the values schema rejects bad input,
# and the rendered objects carry the properties the operator relies on.
set -uo pipefail
cd "$(dirname "$0")/.."
helm="${HELM:-$HOME/.cache/switchyard/k8s-1.20.2/bin/helm}"
chart=charts/switchyard
passed=0
failed=0
check() {
  local name=$1
  shift
  if "$@" >/tmp/switchyard-chart-check.log 2>&1; then
    passed=$((passed + 1))
    echo "ok   - $name"
  else
    failed=$((failed + 1))
    echo "FAIL - $name"
    sed 's/^/       /' /tmp/switchyard-chart-check.log | tail -20
  fi
}
render() { "$helm" template sy "$chart" --namespace switchyard-system --set apiServer.host=10.0.0.1 "$@"; }
rendered=$(mktemp)
trap 'rm -f "$rendered" /tmp/switchyard-chart-check.log' EXIT
render >"$rendered" 2>/dev/null

check "the chart lints clean" "$helm" lint --strict "$chart" --set apiServer.host=10.0.0.1
check "rendering twice gives the same bytes" bash -c "diff <($(declare -f render); helm='$helm' chart='$chart' render) '$rendered'"
check "the chart ships exactly the generated CRDs" \
  diff crds/switchyard.dev_crds.yaml "$chart/crds/switchyard.dev_crds.yaml"
check "the values schema rejects a map size below its minimum" \
  bash -c "! '$helm' template sy '$chart' --set agent.maps.frontends=10"
check "the values schema rejects an unknown value" \
  bash -c "! '$helm' template sy '$chart' --set agent.bogus=1"
check "the agent DaemonSet is updated only by the operator (OnDelete)" \
  grep -q 'type: OnDelete' "$rendered"
check "agents are given the API server's real address" \
  grep -q 'value: "10.0.0.1"' "$rendered"
check "the operator runs as non-root with a read-only root filesystem" \
  bash -c "grep -q 'runAsNonRoot: true' '$rendered' && grep -q 'readOnlyRootFilesystem: true' '$rendered'"
check "the agent tolerates every taint" grep -q -- '- operator: Exists' "$rendered"
check "the agent may write only the status of DataplaneNodes" \
  bash -c "grep -A2 'resources: \[dataplanenodes/status\]' '$rendered' | grep -q 'verbs: \[get, patch, update\]' && ! grep -B3 'verbs: \[get, list, watch, create, patch, update\]' '$rendered' | grep -q switchyard-agent"
check "a ServiceMonitor is rendered only when asked for" \
  bash -c "! grep -q ServiceMonitor '$rendered' && $(declare -f render); helm='$helm' chart='$chart' render --set serviceMonitor.enabled=true | grep -q 'kind: ServiceMonitor'"

echo "chart: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
