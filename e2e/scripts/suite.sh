# Shared by the e2e suites that run tests on a 3-node cluster of their own
# (e2e/scripts/{agent,migration,smoke}.sh, operator/scripts/e2e-smoke.sh). Source
# it after setting SUITE (the name printed on every line), SWITCHYARD_E2E_STATE
# (the suite's own state directory) and SWITCHYARD_E2E_LAST_LOGS; it gives step
# timing, an image table file ($images) and a trap that always tears the cluster
# down.
CARGO=${CARGO:-cargo}
target_directory=${CARGO_TARGET_DIR:-$PWD/target}

milliseconds() { echo $(( $(date +%s%N) / 1000000 )); }
seconds_since() { local elapsed=$(( $(milliseconds) - $1 )); printf '%d.%d' $((elapsed / 1000)) $((elapsed % 1000 / 100)); }
started=$(milliseconds)
step_started=$started
step() {
  printf '%s: %-34s %6s s\n' "$SUITE" "$1" "$(seconds_since "$step_started")" >&2
  step_started=$(milliseconds)
}

images=$(mktemp)
cleanup() {
  local status=$?
  e2e/cluster down >/dev/null 2>&1 || true
  rm -f "$images"
  if [ "$status" -ne 0 ]; then
    echo "$SUITE: FAILED (logs of the cluster: $SWITCHYARD_E2E_LAST_LOGS)" >&2
  fi
}
trap cleanup EXIT

# cluster_up: a fresh 3-node cluster with $images (a cluster an interrupted run of
# this suite left behind in its own state directory is removed first).
cluster_up() {
  e2e/cluster down >/dev/null 2>&1 || true
  SWITCHYARD_E2E_IMAGES=$images e2e/cluster up --nodes 3
  step "cluster up (3 nodes)"
}

# run_tests PACKAGE TEST_FILE LABEL [FILTER]: the ignored tests of one test file,
# inside the cluster's private namespaces, one at a time.
run_tests() {
  local package=$1 test_file=$2 label=$3 filter=${4:-}
  # shellcheck disable=SC2086 # the filter is optional and a single word
  e2e/cluster exec "$CARGO" test --locked --offline --quiet -p "$package" --test "$test_file" \
    -- --ignored --nocapture --test-threads=1 $filter
  step "$label"
}

# cluster_down: down, verified clean, and the suite's total time.
cluster_down() {
  e2e/cluster down
  e2e/cluster verify-clean
  step "cluster down, verified clean"
  printf '%s: %-34s %6s s\n' "$SUITE" "total" "$(seconds_since "$started")" >&2
}

# run_scenarios TEST_FILE LABEL [FILTER]: one test file of the e2e crate on a
# fresh cluster, then down and verified clean.
run_scenarios() {
  cluster_up
  run_tests switchyard-e2e "$1" "$2" "${3:-}"
  cluster_down
}
