# Shared by the e2e suites that run one test file on a 3-node cluster of their
# own (e2e/scripts/agent.sh, e2e/scripts/migration.sh). Source it after setting
# SUITE (the name printed on every line) and SWITCHYARD_E2E_LAST_LOGS; it gives
# step timing, an image table file ($images) and a trap that always tears the
# cluster down.
CARGO=${CARGO:-cargo}
target_directory=${CARGO_TARGET_DIR:-$PWD/target}

milliseconds() { echo $(( $(date +%s%N) / 1000000 )); }
seconds_since() { local elapsed=$(( $(milliseconds) - $1 )); printf '%d.%d' $((elapsed / 1000)) $((elapsed % 1000 / 100)); }
started=$(milliseconds)
step_started=$started
step() {
  printf '%s: %-30s %6s s\n' "$SUITE" "$1" "$(seconds_since "$step_started")" >&2
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

# run_scenarios TEST_FILE LABEL [FILTER]: a fresh 3-node cluster with $images,
# the ignored tests of TEST_FILE inside it one at a time, then down and verified clean.
run_scenarios() {
  local test_file=$1 label=$2 filter=${3:-}
  # A cluster an interrupted run of this suite left behind (own state directory).
  e2e/cluster down >/dev/null 2>&1 || true
  SWITCHYARD_E2E_IMAGES=$images e2e/cluster up --nodes 3
  step "cluster up (3 nodes)"
  # shellcheck disable=SC2086 # the filter is optional and a single word
  e2e/cluster exec "$CARGO" test --locked --offline --quiet -p switchyard-e2e --test "$test_file" \
    -- --ignored --nocapture --test-threads=1 $filter
  step "$label"
  e2e/cluster down
  e2e/cluster verify-clean
  step "cluster down, verified clean"
  printf '%s: %-30s %6s s\n' "$SUITE" "total" "$(seconds_since "$started")" >&2
}
