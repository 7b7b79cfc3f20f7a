# Shared by the shell tests of the project's checks (bench/check-summary.sh,
# e2e/scripts/check-demo-summary.sh, scripts/check-parity.sh): each case runs the check on
# one input and expects it to accept it, or to refuse it for the reason the case names.
# A refusal for another reason fails the case, so that a check which refuses everything
# cannot pass its own test.
#
# The sourcing test sets EXPECT_CHECK to the check's command (an array) before its first
# case, and ends with `expect_summary NAME`.

expect_passed=0
expect_failures=0

# accepts "CASE" INPUT [CHECK ARGUMENTS...]: the check must accept INPUT.
accepts() {
    local case="$1" input="$2" output
    shift 2
    if output=$("${EXPECT_CHECK[@]}" "${input}" "$@" 2>&1); then
        expect_passed=$((expect_passed + 1))
        echo "ok: ${case}"
    else
        expect_failures=$((expect_failures + 1))
        echo "FAILED: ${case}: the check refused it: ${output}" >&2
    fi
}

# refuses "CASE" INPUT "WHAT THE ERROR SAYS" [CHECK ARGUMENTS...]: the check must refuse
# INPUT, and its output must contain the reason.
refuses() {
    local case="$1" input="$2" reason="$3" output
    shift 3
    if output=$("${EXPECT_CHECK[@]}" "${input}" "$@" 2>&1); then
        expect_failures=$((expect_failures + 1))
        echo "FAILED: ${case}: the check accepted it: ${output}" >&2
    elif [[ "${output}" != *"${reason}"* ]]; then
        expect_failures=$((expect_failures + 1))
        echo "FAILED: ${case}: refused, but not for '${reason}': ${output}" >&2
    else
        expect_passed=$((expect_passed + 1))
        echo "ok: ${case}"
    fi
}

# expect_summary NAME: prints the counts and fails when any case failed or none ran.
expect_summary() {
    echo "$1: ${expect_passed} passed, ${expect_failures} failed"
    [ "${expect_failures}" -eq 0 ] && [ "${expect_passed}" -gt 0 ]
}
