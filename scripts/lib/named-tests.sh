# Shared by the checks of pages that name tests (docs/lessons.md, docs/parity.md): a page
# that names a test which no longer exists would promise a proof the code no longer has.

# The Rust trees a named test may live in.
NAMED_TEST_TREES=(crds operator node-agent e2e ebpf telemetry bench)

# check_named_tests PAGE NAME...: prints each NAME with no `fn NAME(` in the trees and
# returns the number missing (0 when every one exists).
check_named_tests() {
    local page="$1"
    shift
    local missing=0 test_name
    for test_name in "$@"; do
        if ! grep -rqE "fn ${test_name}\(" --include='*.rs' "${NAMED_TEST_TREES[@]}"; then
            echo "${page} names a test that does not exist: ${test_name}" >&2
            missing=$((missing + 1))
        fi
    done
    [ "${missing}" -eq 0 ]
}

# backticked_snake_case_words: the `snake_case` words of stdin, one per line, sorted, unique
# (test names are sentences, so they always contain an underscore).
backticked_snake_case_words() {
    grep -oE '`[a-z][a-z0-9_]+`' | tr -d '`' | grep '_' | sort -u || true
}
