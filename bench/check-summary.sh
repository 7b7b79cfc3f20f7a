#!/usr/bin/env bash
# Checks that a bench summary is well-formed: a non-empty JSON list whose every entry
# has exactly name, system, scale, metric, value, unit with the right types. It checks
# the shape, never the speed. The bench's own arguments may follow the summary's path: a run
# limited with `--parts` (dataplane, control, operator) is checked for those parts only.
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
names=()
for part in ${parts//,/ }; do
  case $part in
    dataplane) names+=(dataplane ${flatness[@]+"${flatness[@]}"}) ;;
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
for name in "${names[@]}"; do
  jq -e --arg name "$name" 'any(.[]; .name == $name)' "$summary" >/dev/null \
    || { echo "check-summary: failed to find any '$name' measurement in $summary" >&2; exit 1; }
done
echo "check-summary: $summary: $(jq length "$summary") measurements, well-formed" >&2
