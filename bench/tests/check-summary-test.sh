#!/usr/bin/env bash
# Tests bench/check-summary.sh, the check `make bench` runs on the summary it wrote:
# summaries made here, one per rule, each run through the check, which must accept
# or refuse it for the reason the case names. The well-formed summaries are the
# controls: they prove that a refusal comes from the rule under test, not from a
# check that refuses everything. Run by `make bench-quick` before the bench itself.
set -euo pipefail
cd "$(dirname "$0")/../.."
check=bench/check-summary.sh
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# One summary entry, as `switchyard-bench` writes it (report::Measurement).
row() {
  jq -cn --arg name "$1" --arg system "$2" --argjson scale "$3" --arg metric "$4" \
    --argjson value "$5" --arg unit "$6" \
    '{name: $name, system: $system, scale: $scale, metric: $metric, value: $value, unit: $unit}'
}

# The figures of one measured system: runs, a median with its spread, and a count.
measured() {
  local name=$1 system=$2 scale=$3 metric=$4 unit=$5
  row "$name" "$system" "$scale" runs 3 runs
  row "$name" "$system" "$scale" "$metric" 10 "$unit"
  row "$name" "$system" "$scale" "$metric-min" 9 "$unit"
  row "$name" "$system" "$scale" "$metric-max" 11 "$unit"
}

# What a quick run writes when everything could be measured: every part, every
# system of the data plane, the flatness rounds, the control plane and the operator.
{
  for system in direct switchyard switchyard-tc-only kube-proxy-iptables-legacy kube-proxy-iptables-nft; do
    measured dataplane "$system" 100 new-connections-per-second 1/s
    row dataplane "$system" 100 failed-operations 0 operations
  done
  for system in switchyard switchyard-tc-only; do
    measured program-cpu "$system" 100 ns-per-connection ns
    row program-cpu "$system" 100 sy_ingress_pod-verified-instructions 4242 instructions
    measured parity-cost "$system" 100 with-source-ranges-over-without-same-round percent
    row parity-cost "$system" 100 failed-operations 0 operations
  done
  for scale in 100 1000; do
    measured latency-flatness switchyard "$scale" fixed-rate-connect-latency-p99 us
    row latency-flatness switchyard "$scale" failed-connections 0 connections
  done
  for system in switchyard kube-proxy-iptables-legacy kube-proxy-iptables-nft; do
    measured programming-latency "$system" 100 p99 ms
  done
  measured agent-cold-start switchyard 100 peak-rss MiB
  row agent-cold-start switchyard 100 rss null MiB
  for system in switchyard kube-proxy-iptables-legacy; do
    measured restart-disruption "$system" 100 p99-during-restart ms
    row restart-disruption "$system" 100 failed 0 connections
  done
  measured operator-transition switchyard-operator 20 operator-time s
  row bench bench 0 total-runtime 95 s
} | jq -s . >"$work/well-formed.json"

# Writes $work/NAME.json: the well-formed summary changed by the jq FILTER.
derive() {
  jq "$2" "$work/well-formed.json" >"$work/$1.json"
}

# Every row of the systems matching REGEX replaced by what the bench records when
# all their runs fail: one `failed-to-measure` row per measurement and scale.
all_failed() {
  jq --arg systems "$1" '
    [.[] | select(.system | test($systems) | not)] +
    ([.[] | select(.system | test($systems))] | unique_by([.name, .system, .scale])
     | map(.metric = "failed-to-measure" | .value = 3 | .unit = "runs"))
  ' "$work/well-formed.json" >"$work/$2.json"
}

# The check run on the summary NAME written above: $work/NAME.json.
check_summary() {
  bash "$check" "$work/$1.json" "${@:2}"
}
EXPECT_CHECK=(check_summary)
# shellcheck source=scripts/lib/expect.sh
source scripts/lib/expect.sh

all_failed '^switchyard' every-switchyard-measurement-failed
derive one-programming-run-failed \
  '. + [{name: "programming-latency", system: "switchyard", scale: 100, metric: "failed-to-measure", value: 1, unit: "runs"}]'
all_failed '^direct$' direct-failed
all_failed '^switchyard-operator$' operator-failed
derive flatness-failed \
  '. + [{name: "latency-flatness", system: "switchyard", scale: 1000, metric: "failed-to-measure", value: 1, unit: "configurations"}]'
all_failed '^kube-proxy-iptables-nft$' nft-could-not-serve
derive restart-only-failed-kube-proxy \
  '[.[] | select(.name != "restart-disruption")] + [{name: "restart-disruption", system: "kube-proxy-iptables-legacy", scale: 100, metric: "failed-to-measure", value: 3, unit: "runs"}]'
derive operator-missing '[.[] | select(.name != "operator-transition")]'
derive value-is-text '.[0].value = "fast"'
derive program-cpu-missing '[.[] | select(.name != "program-cpu")]'
derive program-cpu-failed \
  '. + [{name: "program-cpu", system: "switchyard", scale: 100, metric: "failed-to-measure", value: 1, unit: "rounds"}]'
derive parity-cost-missing '[.[] | select(.name != "parity-cost")]'
derive parity-cost-failed \
  '. + [{name: "parity-cost", system: "switchyard-tc-only", scale: 100, metric: "failed-to-measure", value: 1, unit: "configurations"}]'

accepts "a summary whose every measurement was taken is accepted" well-formed
accepts "a summary in which kube-proxy with iptables-nft could not serve is accepted" nft-could-not-serve
refuses "a summary whose every Switchyard measurement failed is refused" \
  every-switchyard-measurement-failed "dataplane of switchyard at scale 100: 3 runs failed"
refuses "a summary in which one programming-latency run of Switchyard failed is refused" \
  one-programming-run-failed "programming-latency of switchyard at scale 100: 1 runs failed"
refuses "a summary in which direct pod IP could not be measured is refused" \
  direct-failed "dataplane of direct at scale 100"
refuses "a summary in which the operator transition could not be measured is refused" \
  operator-failed "operator-transition of switchyard-operator at scale 20"
refuses "a summary in which the latency flatness rounds failed is refused" \
  flatness-failed "latency-flatness of switchyard at scale 1000"
refuses "a summary whose restart disruption is only a failed kube-proxy row is refused" \
  restart-only-failed-kube-proxy "failed to find any measured 'restart-disruption'"
refuses "a summary without the operator transition is refused" \
  operator-missing "failed to find any measured 'operator-transition'"
accepts "a summary without the operator transition is accepted when the run left the operator out" \
  operator-missing --parts dataplane,control
refuses "a summary with a value that is not a number is refused" \
  value-is-text "is not a flat list"
refuses "a summary without the programs' CPU per connection is refused" \
  program-cpu-missing "failed to find any measured 'program-cpu'"
accepts "a summary without the programs' CPU is accepted when the run measured no Switchyard configuration" \
  program-cpu-missing --systems direct,kube-proxy-iptables-legacy
refuses "a summary without the programs' CPU is refused when only switchyard-tc-only was measured" \
  program-cpu-missing "failed to find any measured 'program-cpu'" --systems switchyard-tc-only,direct
refuses "a summary whose programs' CPU could not be read is refused" \
  program-cpu-failed "program-cpu of switchyard at scale 100: 1 rounds failed"
refuses "a summary without the cost of source ranges and fragments is refused" \
  parity-cost-missing "failed to find any measured 'parity-cost'"
refuses "a summary whose parity cost could not be measured in one configuration is refused" \
  parity-cost-failed "parity-cost of switchyard-tc-only at scale 100: 1 configurations failed"
accepts "a summary without the parity cost is accepted when the run left the data plane out" \
  parity-cost-missing --parts control,operator

expect_summary check-summary-test
