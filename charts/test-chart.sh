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
# object KIND NAME < rendered: that object's YAML document.
object() {
  awk -v head="(^|\n)kind: $1\nmetadata:\n  name: $2\n" 'BEGIN { RS = "\n---\n" } $0 ~ head { print }'
}
# rule_triples < ClusterRole or Role: one "apiGroup resource verb" line per
# permission its rules grant (core group as ""), sorted. A rule written in any
# other shape than the chart's flow lists (resourceNames, nonResourceURLs, block
# lists) prints an UNPARSED line, so it cannot slip past a comparison.
rule_triples() {
  awk '
    function items(line, out) { sub(/^[^[]*\[/, "", line); sub(/\][ ]*$/, "", line); return split(line, out, /, */) }
    function flush(   g, r, v, i, j, k) {
      if (!started) return
      if (groups == "" || resources == "" || verbs == "") { print "UNPARSED incomplete rule"; return }
      items(groups, g); items(resources, r); items(verbs, v)
      for (i in g) for (j in r) for (k in v) print g[i], r[j], v[k]
    }
    /^rules:/ { inrules = 1; next }
    !inrules { next }
    /^[^ ]/ { inrules = 0; next }
    /^ *(#.*)?$/ { next }
    /^  - apiGroups: \[.*\]$/ { flush(); started = 1; groups = $0; resources = ""; verbs = ""; next }
    /^    resources: \[.*\]$/ { resources = $0; next }
    /^    verbs: \[.*\]$/ { verbs = $0; next }
    { print "UNPARSED " $0 }
    END { flush() }
  ' | sort
}
# The agent's ClusterRole grants exactly this, nothing more (least privilege): it
# watches Services, EndpointSlices, its Node and its DataplaneNode, and writes
# only the DataplaneNode status (Server-Side Apply). Its Events (about its
# DataplaneNode, so in `default`) come from a Role there: expected_agent_event_rules.
expected_agent_rules() {
  rule_triples <<'RULES'
rules:
  - apiGroups: [""]
    resources: [services, nodes]
    verbs: [get, list, watch]
  - apiGroups: [discovery.k8s.io]
    resources: [endpointslices]
    verbs: [get, list, watch]
  - apiGroups: [switchyard.dev]
    resources: [dataplanenodes]
    verbs: [get, list, watch]
  - apiGroups: [switchyard.dev]
    resources: [dataplanenodes/status]
    verbs: [get, patch, update]
RULES
}
expected_agent_event_rules() {
  rule_triples <<'RULES'
rules:
  - apiGroups: [""]
    resources: [events]
    verbs: [create, get, patch]
RULES
}
agent_rules_are_least_privilege() {
  local file=$1
  [ "$(object ClusterRole switchyard-agent <"$file" | grep -c '^kind: ClusterRole$')" -eq 1 ] ||
    { echo "expected exactly one ClusterRole switchyard-agent"; return 1; }
  diff <(expected_agent_rules) <(object ClusterRole switchyard-agent <"$file" | rule_triples) ||
    { echo "(< expected, > rendered) the agent's ClusterRole differs from its least-privilege rules"; return 1; }
  object Role switchyard-agent-events <"$file" | grep -q '^  namespace: default$' ||
    { echo "expected the Role switchyard-agent-events in default, where Events about cluster-scoped objects live"; return 1; }
  diff <(expected_agent_event_rules) <(object Role switchyard-agent-events <"$file" | rule_triples) ||
    { echo "(< expected, > rendered) the agent's Events Role differs from its least-privilege rules"; return 1; }
  # No other (Cluster)Role may be bound to the agent's ServiceAccount.
  local bound
  bound=$(awk 'BEGIN { RS = "\n---\n" }
    /(^|\n)kind: (Cluster)?RoleBinding\n/ && /\n  - kind: ServiceAccount\n    name: switchyard-agent\n/ {
      kind = $0; sub(/.*\nroleRef:\n(  [^\n]*\n)*  kind: /, "", kind); sub(/\n.*/, "", kind)
      name = $0; sub(/.*\nroleRef:\n(  [^\n]*\n)*  name: /, "", name); sub(/\n.*/, "", name)
      print kind "/" name
    }' "$file" | sort | paste -sd ' ')
  [ "$bound" = "ClusterRole/switchyard-agent Role/switchyard-agent-events" ] ||
    { echo "the agent ServiceAccount is bound to: ${bound:-nothing} (expected ClusterRole/switchyard-agent and Role/switchyard-agent-events only)"; return 1; }
}
# no_cluster_wide_pod_reads FILE: no ClusterRole lets anyone list or watch Pods
# (the operator reads them only in the agent's and kube-proxy's namespaces,
# through Roles). Wildcards count, and a rule the parser cannot read fails. A
# rule's resourceNames is dropped before parsing: the rule is then judged as if
# it named every object, which can only fail more often.
no_cluster_wide_pod_reads() {
  local file=$1 role found=0
  while IFS= read -r -d '' role; do
    found=1
    if grep -v '^    resourceNames: ' <<<"$role" | rule_triples | grep -E '^UNPARSED|^("")?[^ ]* ("?\*"?|pods) ("?\*"?|list|watch)$' |
      grep -E '^UNPARSED|^(""|"\*"|\*) '; then
      echo "in ClusterRole $(sed -n 's/^  name: //p' <<<"$role" | head -1)"
      return 1
    fi
  done < <(awk 'BEGIN { RS = "\n---\n" } /(^|\n)kind: ClusterRole\n/ { printf "%s\n%c", $0, 0 }' "$file")
  [ "$found" -eq 1 ] || { echo "no ClusterRole rendered"; return 1; }
}
# pods_readable_in NAMESPACE ROLE FILE: the Role ROLE in NAMESPACE lets the
# operator get, list and watch Pods there.
pods_readable_in() {
  local namespace=$1 role=$2 file=$3 triples
  object Role "$role" <"$file" | grep -q "^  namespace: $namespace\$" ||
    { echo "no Role $role in $namespace"; return 1; }
  triples=$(object Role "$role" <"$file" | rule_triples)
  for verb in get list watch; do
    grep -qx "\"\" pods $verb" <<<"$triples" || { echo "Role $role lacks pods $verb"; return 1; }
  done
}
# kube_proxy_targets < rendered: "role=NS/NAME config=NS/NAME management=M", the
# DaemonSet the operator may patch and the one the chart's DataplaneConfig names.
kube_proxy_targets() {
  local file role_ns role_name config
  file=$(cat)
  role_ns=$(object Role switchyard-operator-kube-proxy <<<"$file" | sed -n 's/^  namespace: //p')
  role_name=$(object Role switchyard-operator-kube-proxy <<<"$file" | sed -n 's/^    resourceNames: \[\(.*\)\]$/\1/p')
  config=$(object DataplaneConfig default <<<"$file" | awk '
    /^  kubeProxy:$/ { on = 1; next }
    on && /^    [a-zA-Z]+: / { key = $1; sub(/:$/, "", key); value[key] = $2; next }
    { on = 0 }
    END { printf "config=%s/%s management=%s", value["namespace"], value["daemonSetName"], value["management"] }')
  echo "role=$role_ns/$role_name $config"
}
# expect_kube_proxy_targets EXPECTED RENDER-ARGS...: the Role and the DataplaneConfig
# both name the DaemonSet EXPECTED (NS/NAME); extra "management=M" is checked too.
expect_kube_proxy_targets() {
  local want=$1 management=${2#management=} got
  shift 2
  got=$(render --set dataplaneConfig.create=true "$@" | kube_proxy_targets) || return 1
  echo "got: $got"
  [ "$got" = "role=$want config=$want management=$management" ]
}
# expect_mismatch_fails FIELD RENDER-ARGS...: rendering fails, naming the field.
expect_mismatch_fails() {
  local field=$1 output
  shift
  if output=$(render --set dataplaneConfig.create=true "$@" 2>&1); then
    echo "rendering succeeded; expected a failure about dataplaneConfig.spec.kubeProxy.$field"
    return 1
  fi
  echo "$output"
  grep -q "dataplaneConfig.spec.kubeProxy.$field (.*) must match kubeProxy.$field" <<<"$output"
}
rendered=$(mktemp)
trap 'rm -f "$rendered" /tmp/switchyard-chart-check.log' EXIT
render >"$rendered" 2>/dev/null

check "the chart lints clean" "$helm" lint --strict "$chart" --set apiServer.host=10.0.0.1
check "rendering twice gives the same bytes" bash -c "diff <($(declare -f render); helm='$helm' chart='$chart' render) '$rendered'"
check "the chart ships exactly the generated CRDs" \
  diff crds/switchyard.dev_crds.yaml "$chart/crds/switchyard.dev_crds.yaml"
check "the values schema rejects a map size below its minimum" \
  bash -c "! '$helm' template sy '$chart' --set agent.maps.frontends=10"
check "the agent points pods' TCP connects at a backend by default" \
  grep -q -- '--pod-connect-time-load-balancing=tcp' "$rendered"
check "the values schema rejects an unknown pod connect-time mode" \
  bash -c "! '$helm' template sy '$chart' --set agent.podConnectTimeLoadBalancing=udp"
check "the agent serves NodePorts on every local address and on localhost by default (kube-proxy 1.20 iptables)" \
  bash -c "grep -q -- '--node-port-addresses=\$' '$rendered' && grep -q -- '--localhost-node-ports=true' '$rendered'"
check "nodePortAddresses and localhostNodePorts reach the agent's flags" \
  bash -c "$(declare -f render); helm='$helm' chart='$chart'; render --set 'agent.nodePortAddresses={10.0.0.0/8,127.0.0.0/8}' --set agent.localhostNodePorts=false \
    | grep -q -- '--node-port-addresses=10.0.0.0/8,127.0.0.0/8' && render --set agent.localhostNodePorts=false | grep -q -- '--localhost-node-ports=false'"
check "the values schema rejects a nodePortAddresses entry that is neither a CIDR nor primary" \
  bash -c "! '$helm' template sy '$chart' --set 'agent.nodePortAddresses={all}'"
check "the values schema rejects an unknown value" \
  bash -c "! '$helm' template sy '$chart' --set agent.bogus=1"
check "the agent DaemonSet is updated only by the operator (OnDelete)" \
  grep -q 'type: OnDelete' "$rendered"
check "agents are given the API server's real address" \
  grep -q 'value: "10.0.0.1"' "$rendered"
check "the operator is given the API server's real address for its own client" \
  grep -q -- '- --api-server-address=10.0.0.1:6443' "$rendered"
check "the operator runs as non-root with a read-only root filesystem" \
  bash -c "grep -q 'runAsNonRoot: true' '$rendered' && grep -q 'readOnlyRootFilesystem: true' '$rendered'"
check "the agent tolerates every taint" grep -q -- '- operator: Exists' "$rendered"
check "the agent may write only the status of DataplaneNodes" \
  bash -c "grep -A2 'resources: \[dataplanenodes/status\]' '$rendered' | grep -q 'verbs: \[get, patch, update\]' && ! grep -B3 'verbs: \[get, list, watch, create, patch, update\]' '$rendered' | grep -q switchyard-agent"
check "the agent's RBAC is exactly its least-privilege rules (writes only DataplaneNode status and Events in default)" \
  agent_rules_are_least_privilege "$rendered"
check "the agent's RBAC stays least-privilege with every optional object rendered" \
  bash -c "$(declare -f render object rule_triples expected_agent_rules expected_agent_event_rules agent_rules_are_least_privilege); helm='$helm' chart='$chart'
    all=\$(mktemp); trap 'rm -f \$all' EXIT
    render --set dataplaneConfig.create=true --set serviceMonitor.enabled=true --set operator.applyCrds=false >\$all &&
    agent_rules_are_least_privilege \$all"
check "the rule parser of these checks sees a widened agent rule" \
  bash -c "$(declare -f object rule_triples expected_agent_rules expected_agent_event_rules agent_rules_are_least_privilege)
    widened=\$(mktemp); trap 'rm -f \$widened' EXIT
    sed '/^  name: switchyard-agent\$/,/^---/ s/^    verbs: \[get, patch, update\]\$/    verbs: [get, patch, update, delete]/' '$rendered' >\$widened &&
    ! cmp -s '$rendered' \$widened && ! agent_rules_are_least_privilege \$widened"
check "the rule parser of these checks sees a widened agent Events rule" \
  bash -c "$(declare -f object rule_triples expected_agent_rules expected_agent_event_rules agent_rules_are_least_privilege)
    widened=\$(mktemp); trap 'rm -f \$widened' EXIT
    sed '/^  name: switchyard-agent-events\$/,/^---/ s/^    verbs: \[create, get, patch\]\$/    verbs: [create, get, patch, delete, list]/' '$rendered' >\$widened &&
    ! cmp -s '$rendered' \$widened && ! agent_rules_are_least_privilege \$widened"
check "the agent records Events only in default, not cluster-wide" \
  bash -c "$(declare -f object rule_triples expected_agent_rules expected_agent_event_rules agent_rules_are_least_privilege)
    moved=\$(mktemp); trap 'rm -f \$moved' EXIT
    sed '/^  name: switchyard-agent-events\$/,/^---/ s/^  namespace: default\$/  namespace: kube-system/' '$rendered' >\$moved &&
    ! cmp -s '$rendered' \$moved && ! agent_rules_are_least_privilege \$moved"
check "no ClusterRole lets the operator (or anyone) list or watch Pods cluster-wide" \
  no_cluster_wide_pod_reads "$rendered"
check "the operator reads Pods in the agent's namespace and in kube-proxy's (Roles)" \
  bash -c "$(declare -f object rule_triples pods_readable_in)
    pods_readable_in switchyard-system switchyard-operator '$rendered' &&
    pods_readable_in kube-system switchyard-operator-kube-proxy '$rendered'"
check "the operator reads Pods in kube-proxy's namespace wherever kubeProxy.namespace says" \
  bash -c "$(declare -f render object rule_triples pods_readable_in); helm='$helm' chart='$chart'
    moved=\$(mktemp); trap 'rm -f \$moved' EXIT
    render --set kubeProxy.namespace=kp-system >\$moved &&
    pods_readable_in kp-system switchyard-operator-kube-proxy \$moved"
check "the cluster-wide Pod check sees Pods put back into the operator's ClusterRole" \
  bash -c "$(declare -f object rule_triples no_cluster_wide_pod_reads)
    widened=\$(mktemp); trap 'rm -f \$widened' EXIT
    sed '/^  name: switchyard-operator\$/,/^---/ s/^    resources: \[nodes\]\$/    resources: [nodes, pods]/' '$rendered' >\$widened &&
    ! cmp -s '$rendered' \$widened && ! no_cluster_wide_pod_reads \$widened"
check "the cluster-wide Pod check sees a wildcard resource" \
  bash -c "$(declare -f object rule_triples no_cluster_wide_pod_reads)
    widened=\$(mktemp); trap 'rm -f \$widened' EXIT
    sed '/^  name: switchyard-operator\$/,/^---/ s/^    resources: \[nodes\]\$/    resources: [\"*\"]/' '$rendered' >\$widened &&
    ! cmp -s '$rendered' \$widened && ! no_cluster_wide_pod_reads \$widened"
check "the chart's DataplaneConfig names the DaemonSet the operator may patch (defaults)" \
  expect_kube_proxy_targets kube-system/kube-proxy management=
check "the chart's DataplaneConfig follows kubeProxy.* when its spec leaves kubeProxy unset" \
  expect_kube_proxy_targets kp-system/proxy management= \
  --set kubeProxy.namespace=kp-system --set kubeProxy.daemonSetName=proxy
check "a matching spec.kubeProxy renders, its management kept" \
  expect_kube_proxy_targets kp-system/proxy management=External \
  --set kubeProxy.namespace=kp-system --set kubeProxy.daemonSetName=proxy \
  --set dataplaneConfig.spec.kubeProxy.namespace=kp-system --set dataplaneConfig.spec.kubeProxy.daemonSetName=proxy \
  --set dataplaneConfig.spec.kubeProxy.management=External
check "a spec.kubeProxy.namespace other than kubeProxy.namespace fails rendering" \
  expect_mismatch_fails namespace --set dataplaneConfig.spec.kubeProxy.namespace=kp-system
check "a spec.kubeProxy.daemonSetName other than kubeProxy.daemonSetName fails rendering" \
  expect_mismatch_fails daemonSetName --set kubeProxy.daemonSetName=proxy \
  --set dataplaneConfig.spec.kubeProxy.daemonSetName=kube-proxy
check "the values schema rejects an unknown field under dataplaneConfig.spec.kubeProxy" \
  bash -c "! '$helm' template sy '$chart' --set dataplaneConfig.spec.kubeProxy.daemonsetName=x"
check "a ServiceMonitor is rendered only when asked for" \
  bash -c "! grep -q ServiceMonitor '$rendered' && $(declare -f render); helm='$helm' chart='$chart' render --set serviceMonitor.enabled=true | grep -q 'kind: ServiceMonitor'"

echo "chart: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
