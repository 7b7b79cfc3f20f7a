#!/usr/bin/env bash
# Checks the summary `switchyard-demo --summary PATH` wrote (run by `make demo-check`):
#
#   bash e2e/scripts/check-demo-summary.sh SUMMARY.json [--min-connections N]
#
# Accepts it only when both directions really happened and nothing broke:
# - exactly two directions, KubeProxy -> Ebpf then Ebpf -> KubeProxy, each Ready in its target;
# - zero failed connections in each (the direction's total and every flow's own count);
# - every flow of new connections answered at least N times (default 100) by both backends, so
#   a generator that stalled cannot read as "no failures";
# - kube-proxy's rules for the demo Service on every node before and gone after the way there,
#   gone before and back after the way back; every node serving from eBPF after the way there
#   and none after the way back (what the cluster shows, not what the demo claims);
# - the way back drained: long-lived connections carried by eBPF, none broken or reopened, at
#   least one node seen draining with live flows, and every node detached after the clients
#   hung up (not before: the drain waited for them), sooner than the drain timeout (so the
#   drain ended with the connections).
# Prints every reason it refuses (one a line, "failed: ...") and exits 1; prints one line per
# direction and exits 0 when it accepts.
set -euo pipefail

usage() {
  echo "usage: $0 SUMMARY.json [--min-connections N]" >&2
  exit 2
}
[ $# -ge 1 ] || usage
summary=$1
shift
min_connections=100
while [ $# -gt 0 ]; do
  case "$1" in
    --min-connections) [ $# -ge 2 ] || usage; min_connections=$2; shift 2 ;;
    *) usage ;;
  esac
done
[[ "$min_connections" =~ ^[0-9]+$ ]] || usage

if [ ! -f "$summary" ]; then
  echo "failed: no demo summary at $summary (did the demo stop before writing it?)" >&2
  exit 1
fi
if ! jq -e 'type == "object" and (.directions | type == "array")' "$summary" >/dev/null 2>&1; then
  echo "failed: $summary is not a demo summary (a JSON object with a list of directions)" >&2
  exit 1
fi

# Every reason to refuse, one a line; empty when the summary passes.
problems=$(jq -r --argjson min "$min_connections" '
  def number_or_null: if type == "number" then . else null end;
  def direction_name: "\(.from) -> \(.to)";
  def check_direction($index; $from; $to):
    (.directions[$index]) as $direction
    | if $direction == null then
        "failed to find the direction \($from) -> \($to) (direction \($index + 1) of the summary)"
      elif $direction.from != $from or $direction.to != $to then
        "failed to find the direction \($from) -> \($to): direction \($index + 1) is \($direction | direction_name)"
      else
        ($direction | direction_name) as $name
        | (if $direction.reached != true then
             "\($name): the DataplaneConfig did not reach Ready in \($to)" else empty end),
          (if ($direction.failures | number_or_null) == null then
             "\($name): no failure count" 
           elif $direction.failures != 0 then
             "\($name): \($direction.failures) connections failed" else empty end),
          (if ($direction.flows | type) != "array" or ($direction.flows | length) == 0 then
             "\($name): no traffic flows recorded" else empty end),
          ($direction.flows // [] | .[]
            | . as $flow
            | (if ($flow.failures | number_or_null) != 0 then
                 "\($name): \($flow.name): \($flow.failures) connections failed" else empty end),
              (if $flow.long_lived != true and (($flow.successes | number_or_null) // 0) < $min then
                 "\($name): \($flow.name): only \($flow.successes) successful connections (at least \($min) expected)"
               else empty end),
              (if $flow.long_lived != true then
                 ("backend-2", "backend-3")
                 | select((($flow.backends // {})[.] // 0) < 1)
                 | "\($name): \($flow.name) never reached \(.)"
               else empty end)),
          (($direction.kube_proxy_rules // []) | length) as $nodes
          | (if $nodes < 3 then
               "\($name): kube-proxy rules recorded for \($nodes) nodes (3 expected)" else empty end),
            ($direction.kube_proxy_rules // [] | .[]
              | . as $node
              | (if $to == "Ebpf" then [true, false] else [false, true] end) as $expected
              | (if $node.before.demo_service != $expected[0] then
                   "\($name): \($node.node): kube-proxy rules for the demo Service \(if $expected[0] then "missing" else "present" end) before"
                 else empty end),
                (if $node.after.demo_service != $expected[1] then
                   "\($name): \($node.node): kube-proxy rules for the demo Service \(if $expected[1] then "missing" else "still present" end) after"
                 else empty end)),
            (if $to == "Ebpf" and ($direction.nodes_serving_after != $direction.nodes_total or ($direction.nodes_total // 0) < 3) then
               "\($name): \($direction.nodes_serving_after)/\($direction.nodes_total) nodes serving from eBPF after"
             elif $to == "KubeProxy" and $direction.nodes_serving_after != 0 then
               "\($name): \($direction.nodes_serving_after) nodes still serving from eBPF after"
             else empty end)
      end;
  def check_drain:
    (.directions[1]) as $direction
    | if $direction == null or $direction.from != "Ebpf" then empty
      else
        ([$direction.flows // [] | .[] | select(.long_lived == true)]) as $long_lived
        | ($direction.drain) as $drain
        | (if ($long_lived | length) == 0 then
             "Ebpf -> KubeProxy: no long-lived connections to drain" else empty end),
          ($long_lived[]
            | select(.connections_opened != .expected_connections)
            | "Ebpf -> KubeProxy: \(.name): \(.connections_opened) connections opened for \(.expected_connections) (broken ones were reopened)"),
          ($long_lived[]
            | select(((.successes | number_or_null) // 0) < 1)
            | "Ebpf -> KubeProxy: \(.name): no message answered"),
          (if $drain == null then "Ebpf -> KubeProxy: no drain recorded"
           else
             (if (($drain.nodes_seen_draining // []) | length) == 0 then
                "Ebpf -> KubeProxy: no node was seen draining" else empty end),
             (if (($drain.most_live_flows | number_or_null) // 0) < 1 then
                "Ebpf -> KubeProxy: no draining node reported a live flow" else empty end),
             (if ($drain.seconds | number_or_null) == null then
                "Ebpf -> KubeProxy: no drain time (the nodes never all detached)" else empty end),
             (if ($drain.detached_after_hang_up_seconds | number_or_null) == null then
                "Ebpf -> KubeProxy: the nodes never all detached after the clients hung up"
              elif $drain.detached_after_hang_up_seconds < 0 then
                "Ebpf -> KubeProxy: the nodes all detached \(-$drain.detached_after_hang_up_seconds) s before the clients hung up (the drain did not wait for their connections)"
              elif $drain.detached_after_hang_up_seconds >= (($drain.timeout_seconds | number_or_null) // 0) then
                "Ebpf -> KubeProxy: the nodes detached \($drain.detached_after_hang_up_seconds) s after the clients hung up, not before the drain timeout (\($drain.timeout_seconds) s)"
              else empty end)
           end)
      end;
  (if (.directions | length) != 2 then
     "\(.directions | length) directions in the summary (2 expected: KubeProxy -> Ebpf, Ebpf -> KubeProxy)"
   else empty end),
  check_direction(0; "KubeProxy"; "Ebpf"),
  check_direction(1; "Ebpf"; "KubeProxy"),
  check_drain
' "$summary" 2>&1) || {
  echo "failed: $summary could not be read as a demo summary: $problems" >&2
  exit 1
}

if [ -n "$problems" ]; then
  while IFS= read -r problem; do echo "failed: $problem" >&2; done <<<"$problems"
  exit 1
fi
jq -r '.directions[]
  | "ok: \(.from) -> \(.to): Ready in \(.transition_seconds) s, \([.flows[].successes] | add) answers, \(.failures) failed"
    + (if .drain then ", drained \(.drain.seconds) s" else "" end)' "$summary"
