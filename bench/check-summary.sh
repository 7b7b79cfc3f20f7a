#!/usr/bin/env bash
# Checks that a bench summary is well-formed and that every measurement of Switchyard
# was taken. It checks the shape and what could be measured, never the speed.
# - Shape: a non-empty JSON list whose every entry has exactly name, system, scale,
#   metric, value, unit with the right types.
# - Failures: the bench records a measurement it could not take as a `failed-to-measure`
#   row (a data plane configuration, or the number of runs that failed) and goes on, so a
#   run whose every Switchyard measurement failed still writes a summary. Such a row
#   fails the check for every system except kube-proxy: `switchyard`, `switchyard-tc-only`
#   and `switchyard-operator` are what the bench is for, and `direct` runs nothing but the
#   bench's own pods, so its failure is the harness's. kube-proxy 1.20 not serving a scale
#   in time (iptables-nft at 10,000 Services on the development VM) is a finding that the
#   tables report, not a broken harness, so its `failed-to-measure` rows are accepted; the
#   systems not tried after it have no row at all.
# - Presence: each measurement the arguments ask for has at least one row that is not a
#   `failed-to-measure` (with Switchyard in the data plane: `program-cpu`, the programs'
#   CPU per connection, and `parity-cost`, what source ranges and fragments cost).
# The bench's own arguments may follow the summary's path: a run limited with `--parts`
# (dataplane, control, operator) is checked for those parts only.
# bench/tests/check-summary-test.sh proves each rule on summaries made for it.
set -euo pipefail
summary=${1:?usage: check-summary.sh SUMMARY.json [BENCH ARGUMENTS...]}
shift
parts=dataplane,control,operator
systems=switchyard
scales=several
while [ $# -gt 0 ]; do
  case $1 in
    --parts) parts=${2:?--parts needs a value}; shift 2 ;;
    --parts=*) parts=${1#--parts=}; shift ;;
    --systems) systems=${2:?--systems needs a value}; shift 2 ;;
    --systems=*) systems=${1#--systems=}; shift ;;
    --scales) scales=${2:?--scales needs a value}; shift 2 ;;
    --scales=*) scales=${1#--scales=}; shift ;;
    *) shift ;;
  esac
done
# The latency flatness rounds measure switchyard at the fewest and the most
# Services: they run when switchyard is measured at more than one scale.
systems=${systems// /}
distinct_scales=2
if [ "$scales" != several ]; then
  distinct_scales=$(tr ', ' '\n\n' <<<"$scales" | grep -E '^[0-9]+$' | sort -u | wc -l)
fi
flatness=()
if [[ ",$systems," == *,switchyard,* ]] && [ "$distinct_scales" -ge 2 ]; then
  flatness=(latency-flatness)
fi
# Switchyard's programs are measured (their CPU per connection from the kernel's
# statistics, and the cost of source ranges and fragment tracking in rounds of
# their own) whenever either Switchyard configuration is.
programs=()
if [[ ",$systems," == *,switchyard,* || ",$systems," == *,switchyard-tc-only,* ]]; then
  programs=(program-cpu parity-cost)
fi
names=()
for part in ${parts//,/ }; do
  case $part in
    dataplane) names+=(dataplane ${flatness[@]+"${flatness[@]}"} ${programs[@]+"${programs[@]}"}) ;;
    control) names+=(programming-latency agent-cold-start restart-disruption) ;;
    operator) names+=(operator-transition) ;;
    *) echo "check-summary: failed: unknown part '$part' (dataplane, control, operator)" >&2; exit 1 ;;
  esac
done
[ -s "$summary" ] || { echo "check-summary: failed to find $summary" >&2; exit 1; }
jq -e '
  type == "array" and length > 0 and
  all(.[];
    (keys == ["metric","name","scale","system","unit","value"]) and
    (.name | type == "string") and (.system | type == "string") and
    (.scale | type == "number") and (.metric | type == "string") and
    (.unit | type == "string") and (.value | type == "number" or . == null))
' "$summary" >/dev/null || { echo "check-summary: failed: $summary is not a flat list of {name,system,scale,metric,value,unit}" >&2; exit 1; }
failed=$(jq -r '
  .[] | select(.metric == "failed-to-measure" and (.system | startswith("kube-proxy") | not))
  | "\(.name) of \(.system) at scale \(.scale): \(.value) \(.unit) failed"
' "$summary")
if [ -n "$failed" ]; then
  echo "check-summary: failed: $summary records measurements that could not be taken:" >&2
  sed 's/^/  /' <<<"$failed" >&2
  exit 1
fi
for name in "${names[@]}"; do
  jq -e --arg name "$name" 'any(.[]; .name == $name and .metric != "failed-to-measure")' "$summary" >/dev/null \
    || { echo "check-summary: failed to find any measured '$name' in $summary" >&2; exit 1; }
done
echo "check-summary: $summary: $(jq length "$summary") measurements, well-formed" >&2
