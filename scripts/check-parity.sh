#!/usr/bin/env bash
# Fails when docs/parity.md names a test that no longer exists, or calls a behaviour
# "served" without naming a test: the page is the user's answer to "what did I lose by
# leaving kube-proxy", so every "served" must rest on a test that still runs.
# Usage: check-parity.sh [PAGE] (default docs/parity.md; the argument is for its own test).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/named-tests.sh
page="${1:-docs/parity.md}"

# Numbered table rows only: | N | behaviour | follows | status | test |. Tests are named in
# the last cell and only there, so backticked field names elsewhere are never taken.
rows="$(grep -E '^\| *[0-9]+[a-z]? *\|' "${page}" || true)"
if [ -z "${rows}" ]; then
    echo "${page} has no numbered table rows" >&2
    exit 1
fi

unproven=0
while IFS= read -r row; do
    status="$(awk -F'|' '{ print $(NF-2) }' <<<"${row}")"
    test_cell="$(awk -F'|' '{ print $(NF-1) }' <<<"${row}")"
    number="$(awk -F'|' '{ gsub(/ /, "", $2); print $2 }' <<<"${row}")"
    if grep -qE '^ *served' <<<"${status}" && ! grep -q '`' <<<"${test_cell}"; then
        echo "${page} row ${number} is served but names no test" >&2
        unproven=$((unproven + 1))
    fi
done <<<"${rows}"

mapfile -t named < <(awk -F'|' '{ print $(NF-1) }' <<<"${rows}" | backticked_snake_case_words)
if [ "${#named[@]}" -eq 0 ]; then
    echo "${page} names no test at all" >&2
    exit 1
fi
missing=0
check_named_tests "${page}" "${named[@]}" || missing=$?
if [ "${missing}" -ne 0 ] || [ "${unproven}" -ne 0 ]; then
    exit 1
fi
echo "parity-check: all ${#named[@]} tests named in ${page} exist; every served row names one"
