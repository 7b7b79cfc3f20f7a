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

EXPECT_CHECK=(bash scripts/check-parity.sh)
# shellcheck source=scripts/lib/expect.sh
source scripts/lib/expect.sh

accepts "served rows naming existing tests pass; a backticked field outside the test cell is not a test" \
    "$(page proven "| 1 | skip headless | all | served | ${existing} |" \
        "| 2 | not yet done, \`field_name\` in the behaviour | all | not yet: issue 24 | — |")"
refuses "a named test that no longer exists fails the check" \
    "$(page gone "| 1 | skip headless | all | served | ${existing}, \`a_test_that_was_deleted_long_ago\` |")" \
    "names a test that does not exist: a_test_that_was_deleted_long_ago"
refuses "a served row that names no test fails the check" \
    "$(page unproven "| 1 | skip headless | all | served | ${existing} |" "| 2 | skip more | all | served | — |")" \
    "row 2 is served but names no test"
refuses "a page without rows fails the check" "$(page empty "no table here")" "has no numbered table rows"
accepts "docs/parity.md itself passes" docs/parity.md

expect_summary check-parity-test
