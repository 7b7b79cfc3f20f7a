#!/usr/bin/env bash
# Checks that a bench summary is well-formed: a non-empty JSON list whose every entry
# has exactly name, system, scale, metric, value, unit with the right types. It checks
# the shape, never the speed.
set -euo pipefail
summary=${1:?usage: check-summary.sh SUMMARY.json}
[ -s "$summary" ] || { echo "check-summary: failed to find $summary" >&2; exit 1; }
jq -e '
  type == "array" and length > 0 and
  all(.[];
    (keys == ["metric","name","scale","system","unit","value"]) and
    (.name | type == "string") and (.system | type == "string") and
    (.scale | type == "number") and (.metric | type == "string") and
    (.unit | type == "string") and (.value | type == "number" or . == null))
' "$summary" >/dev/null || { echo "check-summary: failed: $summary is not a flat list of {name,system,scale,metric,value,unit}" >&2; exit 1; }
for name in dataplane programming-latency agent-cold-start restart-disruption operator-transition; do
  jq -e --arg name "$name" 'any(.[]; .name == $name)' "$summary" >/dev/null \
    || { echo "check-summary: failed to find any '$name' measurement in $summary" >&2; exit 1; }
done
echo "check-summary: $summary: $(jq length "$summary") measurements, well-formed" >&2
