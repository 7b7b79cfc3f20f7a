#!/usr/bin/env bash
# The parity check's own test: a page whose served rows name existing tests passes (the
# control), and each kind of drift the check exists for fails it.
set -euo pipefail
cd "$(dirname "$0")/../.."
work="$(mktemp -d)"
trap 'rm -rf "${work}"' EXIT
existing='`headless_external_name_and_unallocated_services_are_ignored`'

page() { # page NAME ROW...: a parity page with the given table rows
    local name="$1"
    shift
    {
        echo '| # | behaviour | follows | status | test |'
        echo '|---|---|---|---|---|'
        printf '%s\n' "$@"
    } >"${work}/${name}.md"
    echo "${work}/${name}.md"
}

failures=0
expect() { # expect pass|fail PAGE WHAT
    local wanted="$1" file="$2" what="$3" outcome=pass
    bash scripts/check-parity.sh "${file}" >/dev/null 2>&1 || outcome=fail
    if [ "${outcome}" = "${wanted}" ]; then
        echo "ok: ${what}"
    else
        echo "FAILED: ${what} (expected ${wanted}, got ${outcome})" >&2
        failures=$((failures + 1))
    fi
}

expect pass "$(page proven "| 1 | skip headless | all | served | ${existing} |" \
    "| 2 | not yet done, \`field_name\` in the behaviour | all | not yet: issue 24 | — |")" \
    "served rows naming existing tests pass; a backticked field outside the test cell is not a test"
expect fail "$(page gone "| 1 | skip headless | all | served | ${existing}, \`a_test_that_was_deleted_long_ago\` |")" \
    "a named test that no longer exists fails the check"
expect fail "$(page unproven "| 1 | skip headless | all | served | ${existing} |" "| 2 | skip more | all | served | — |")" \
    "a served row that names no test fails the check"
expect fail "$(page empty "no table here")" "a page without rows fails the check"
expect pass docs/parity.md "docs/parity.md itself passes"

if [ "${failures}" -ne 0 ]; then
    exit 1
fi
echo "check-parity-test: all checks passed"
