#!/usr/bin/env bash
# Fails when docs/lessons.md names a test that no longer exists, so the page that maps
# the competitors' failures to Switchyard's tests cannot drift from the code.
set -euo pipefail
cd "$(dirname "$0")/.."
missing=0
named=0
for test_name in $(grep -oE '`[a-z][a-z0-9_]+`' docs/lessons.md | tr -d '`' | grep '_' | sort -u); do
    named=$((named + 1))
    if ! grep -rqE "fn ${test_name}\(" --include='*.rs' crds operator node-agent e2e ebpf telemetry bench; then
        echo "docs/lessons.md names a test that does not exist: ${test_name}" >&2
        missing=$((missing + 1))
    fi
done
if [ "${named}" -eq 0 ]; then
    echo "docs/lessons.md names no test at all" >&2
    exit 1
fi
if [ "${missing}" -ne 0 ]; then
    exit 1
fi
echo "lessons-check: all ${named} tests named in docs/lessons.md exist"
