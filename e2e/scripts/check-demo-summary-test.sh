#!/usr/bin/env bash
# Tests e2e/scripts/check-demo-summary.sh, the check `make demo-check` runs on the summary
# the demo wrote: a well-formed summary of both directions (the control: it proves that a
# refusal comes from the rule under test, not from a check that refuses everything), then
# one summary per rule, each changed from it in one way, which the check must refuse for the
# reason the case names. Run by `make demo-check` before the demo itself; takes a second.
set -euo pipefail
cd "$(dirname "$0")/../.."
check=e2e/scripts/check-demo-summary.sh
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# One node's kube-proxy rules before and after a direction, as the demo writes them.
rules() {
  jq -cn --arg node "$1" --argjson before "$2" --argjson after "$3" '
    def count($present): {rules: (if $present then 21 else 2 end),
                          service_chains: (if $present then 3 else 0 end), demo_service: $present};
    {node: $node, before: count($before), after: count($after)}'
}
short_flow() {
  jq -cn --arg name "$1" '{name: $name, long_lived: false, attempts: 1500, successes: 1500,
    failures: 0, connections_opened: 0, expected_connections: null,
    backends: {"backend-2": 760, "backend-3": 740}}'
}
long_flow() {
  jq -cn --arg name "$1" '{name: $name, long_lived: true, attempts: 400, successes: 400,
    failures: 0, connections_opened: 10, expected_connections: 10,
    backends: {"backend-2": 210, "backend-3": 190}}'
}

# What the demo writes when both directions went well.
there_rules=$(for node in node-1 node-2 node-3; do rules "$node" true false; done | jq -cs .)
back_rules=$(for node in node-1 node-2 node-3; do rules "$node" false true; done | jq -cs .)
short_flows=$( { short_flow "client pod -> ClusterIP"; short_flow "outside -> NodePort"; } | jq -cs .)
long_flows=$( { long_flow "long-lived client pod -> ClusterIP"; long_flow "long-lived outside -> NodePort"; } | jq -cs .)
jq -n --argjson there_rules "$there_rules" --argjson back_rules "$back_rules" \
  --argjson short "$short_flows" --argjson long "$long_flows" '{
  directions: [
    {from: "KubeProxy", to: "Ebpf", reached: true, transition_seconds: 14.2, traffic_seconds: 20.1,
     flows: $short, failures: 0, nodes_serving_after: 3, nodes_total: 3, rules_cleaned_after: 3,
     kube_proxy_rules: $there_rules, drain: null},
    {from: "Ebpf", to: "KubeProxy", reached: true, transition_seconds: 9.8, traffic_seconds: 14.0,
     flows: ($short + $long), failures: 0, nodes_serving_after: 0, nodes_total: 3,
     rules_cleaned_after: 0, kube_proxy_rules: $back_rules,
     drain: {timeout_seconds: 120, nodes_seen_draining: ["node-1"], most_live_flows: 20,
             seconds: 4.1, held_seconds: 3.0, detached_after_hang_up_seconds: 0.6}}
  ],
  demo_seconds: 75
}' >"$work/well-formed.json"

# Writes $work/NAME.json: the well-formed summary changed by the jq FILTER.
derive() {
  jq "$2" "$work/well-formed.json" >"$work/$1.json"
}

# The check run on the summary NAME written above: $work/NAME.json.
check_summary() {
  bash "$check" "$work/$1.json" "${@:2}"
}
EXPECT_CHECK=(check_summary)
# shellcheck source=scripts/lib/expect.sh
source scripts/lib/expect.sh

derive failed-on-the-way-there '.directions[0].failures = 2 | .directions[0].flows[1].failures = 2'
derive failed-on-the-way-back '.directions[1].failures = 1 | .directions[1].flows[0].failures = 1'
derive total-hides-a-flow-failure '.directions[1].flows[3].failures = 1'
derive only-the-way-there '.directions |= [.[0]]'
derive directions-swapped '.directions |= [.[1], .[0]]'
derive way-back-not-ready '.directions[1].reached = false'
derive too-few-connections '.directions[0].flows[0].successes = 40'
derive one-backend-only '.directions[1].flows[1].backends = {"backend-2": 1500}'
derive rules-never-cleaned '.directions[0].kube_proxy_rules[2].after.demo_service = true'
derive rules-never-restored '.directions[1].kube_proxy_rules[0].after.demo_service = false'
derive a-node-not-serving '.directions[0].nodes_serving_after = 2'
derive two-nodes-recorded '.directions[1].kube_proxy_rules |= .[0:2]'
derive no-long-lived '.directions[1].flows |= map(select(.long_lived | not))'
derive long-lived-reopened '.directions[1].flows[2].connections_opened = 13'
derive nothing-drained '.directions[1].drain.nodes_seen_draining = [] | .directions[1].drain.most_live_flows = 0'
derive drained-until-the-timeout '.directions[1].drain.detached_after_hang_up_seconds = 120.3'
derive detached-before-hang-up '.directions[1].drain.detached_after_hang_up_seconds = -1.5'
derive never-detached '.directions[1].drain.seconds = null | .directions[1].drain.detached_after_hang_up_seconds = null'
derive failures-as-text '.directions[0].failures = "none"'
echo '[1, 2]' >"$work/not-a-summary.json"

accepts "a summary of both directions without a failure is accepted" well-formed
accepts "a summary with fewer answers is accepted under a lower minimum" too-few-connections \
  --min-connections 40
refuses "a summary with failed connections on the way there is refused" \
  failed-on-the-way-there "KubeProxy -> Ebpf: 2 connections failed"
refuses "a summary with a failed connection on the way back is refused" \
  failed-on-the-way-back "Ebpf -> KubeProxy: 1 connections failed"
refuses "a summary whose total hides a flow's failure is refused" \
  total-hides-a-flow-failure "long-lived outside -> NodePort: 1 connections failed"
refuses "a summary of the way there only is refused" \
  only-the-way-there "failed to find the direction Ebpf -> KubeProxy"
refuses "a summary with the directions in the wrong order is refused" \
  directions-swapped "failed to find the direction KubeProxy -> Ebpf: direction 1 is Ebpf -> KubeProxy"
refuses "a summary whose way back did not reach Ready is refused" \
  way-back-not-ready "did not reach Ready in KubeProxy"
refuses "a summary with too few successful connections is refused" \
  too-few-connections "only 40 successful connections (at least 100 expected)"
refuses "a summary whose flow reached one backend only is refused" \
  one-backend-only "outside -> NodePort never reached backend-3"
refuses "a summary whose kube-proxy rules stayed on the way there is refused" \
  rules-never-cleaned "node-3: kube-proxy rules for the demo Service still present after"
refuses "a summary whose kube-proxy rules never came back is refused" \
  rules-never-restored "node-1: kube-proxy rules for the demo Service missing after"
refuses "a summary with a node not serving from eBPF is refused" \
  a-node-not-serving "2/3 nodes serving from eBPF after"
refuses "a summary with rules of two nodes only is refused" \
  two-nodes-recorded "kube-proxy rules recorded for 2 nodes"
refuses "a summary whose way back had no long-lived connections is refused" \
  no-long-lived "no long-lived connections to drain"
refuses "a summary whose long-lived connections were reopened is refused" \
  long-lived-reopened "13 connections opened for 10"
refuses "a summary in which no node drained is refused" \
  nothing-drained "no node was seen draining"
refuses "a summary whose drain ended only at its timeout is refused" \
  drained-until-the-timeout "not before the drain timeout (120 s)"
refuses "a summary whose nodes detached before the clients hung up is refused" \
  detached-before-hang-up "detached 1.5 s before the clients hung up"
refuses "a summary whose nodes never all detached is refused" \
  never-detached "no drain time"
refuses "a summary with a failure count that is not a number is refused" \
  failures-as-text "KubeProxy -> Ebpf: no failure count"
refuses "a file that is not a demo summary is refused" \
  not-a-summary "is not a demo summary"
refuses "a missing summary is refused" \
  missing "no demo summary at"

expect_summary check-demo-summary-test
