#!/usr/bin/env bash
# Fails when docs/lessons.md names a test that no longer exists, so the page that maps
# the competitors' failures to Switchyard's tests cannot drift from the code.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/named-tests.sh
mapfile -t named < <(backticked_snake_case_words < docs/lessons.md)
if [ "${#named[@]}" -eq 0 ]; then
    echo "docs/lessons.md names no test at all" >&2
    exit 1
fi
check_named_tests docs/lessons.md "${named[@]}" || exit 1
echo "lessons-check: all ${#named[@]} tests named in docs/lessons.md exist"
