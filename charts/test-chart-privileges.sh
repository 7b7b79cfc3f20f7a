#!/usr/bin/env bash
# The chart's privileges, rendered (make chart-test): the agent container gets
# exactly the capabilities measured as needed (node-agent/tests/datapath_privileges.rs;
# the README's Privileges), each with a comment saying why, and no privilege
# beyond them; only the init container that mounts the BPF filesystem is
# privileged, for the Bidirectional propagation that carries its mount to the host.
set -uo pipefail
cd "$(dirname "$0")/.."
helm="${HELM:-$HOME/.cache/switchyard/k8s-1.20.2/bin/helm}"
chart=charts/switchyard
passed=0
failed=0
log=$(mktemp /tmp/switchyard-chart-privileges.XXXXXX)
trap 'rm -f "$log" "$rendered" "$without_mount"' EXIT
check() {
  local name=$1
  shift
  if "$@" >"$log" 2>&1; then
    passed=$((passed + 1))
    echo "ok   - $name"
  else
    failed=$((failed + 1))
    echo "FAIL - $name"
    sed 's/^/       /' "$log" | tail -20
  fi
}
render() { "$helm" template sy "$chart" --namespace switchyard-system --set apiServer.host=10.0.0.1 "$@"; }
# daemonset < rendered: the agent DaemonSet's document.
daemonset() {
  awk 'BEGIN { RS = "\n---\n" } /(^|\n)kind: DaemonSet\nmetadata:\n  name: switchyard-agent\n/ { print }'
}
# container NAME < DaemonSet: that container's (or init container's) lines, up to
# the next container or the pod's volumes.
container() {
  awk -v name="$1" '
    $0 ~ "^        - name: " name "$" { inside = 1; print; next }
    inside && (/^        - name: / || /^      [a-zA-Z]/) { inside = 0 }
    inside { print }
  '
}
# added_capabilities < container: one line per item of capabilities.add, as
# "NAME" or "NAME #" when a comment says why; a flow list prints UNPARSED.
added_capabilities() {
  awk '
    /^ *add: *\[/ { print "UNPARSED " $0; next }
    /^ *add: *$/ { inside = 1; indent = index($0, "add:"); next }
    inside && /^ *- / && index($0, "-") > indent {
      line = $0; sub(/^ *- */, "", line)
      comment = index(line, "#") ? " #" : ""
      sub(/ *#.*$/, "", line); sub(/ *$/, "", line)
      print line comment; next
    }
    inside { inside = 0 }
  '
}
expected_capabilities() {
  printf '%s #\n' BPF PERFMON NET_ADMIN NET_RAW SYS_RESOURCE SYS_NICE
}
# The agent container adds exactly the expected capabilities, each with its
# comment, drops ALL, and may not escalate or run privileged.
agent_capabilities_are_exactly() { # FILE
  local agent
  agent=$(daemonset <"$1" | container agent)
  diff <(expected_capabilities) <(added_capabilities <<<"$agent") || return 1
  grep -q '^ *drop: \[ALL\]$' <<<"$agent" || { echo "the agent does not drop ALL"; return 1; }
  grep -q '^ *privileged: false$' <<<"$agent" || { echo "the agent is not privileged: false"; return 1; }
  grep -q '^ *allowPrivilegeEscalation: false$' <<<"$agent" || { echo "the agent may escalate"; return 1; }
}
# The init container mounts bpffs at the pin directory's root through
# Bidirectional propagation, and the agent sees it HostToContainer.
bpf_filesystem_mounts_as_measured() { # FILE
  local pod init agent
  pod=$(daemonset <"$1")
  init=$(container mount-bpf-fs <<<"$pod")
  agent=$(container agent <<<"$pod")
  grep -q '^ *- mount-bpf-fs$' <<<"$init" || { echo "the init container does not run mount-bpf-fs"; return 1; }
  grep -q '^ *- --bpf-pin-dir=/sys/fs/bpf/switchyard$' <<<"$init" || { echo "no pin directory"; return 1; }
  grep -q '^ *privileged: true$' <<<"$init" || { echo "the init container is not privileged"; return 1; }
  grep -A2 '^ *- name: bpffs$' <<<"$init" | grep -q 'mountPropagation: Bidirectional' ||
    { echo "the init container's bpffs is not Bidirectional"; return 1; }
  grep -A2 '^ *- name: bpffs$' <<<"$agent" | grep -q 'mountPropagation: HostToContainer' ||
    { echo "the agent's bpffs is not HostToContainer"; return 1; }
}
# Nothing but the init container is privileged; SYS_ADMIN appears only in comments.
only_the_init_container_is_privileged() { # FILE (read once: it may be a pipe)
  local text
  text=$(cat "$1")
  [ "$(grep -c '^ *privileged: true$' <<<"$text")" = 1 ] || { grep -n 'privileged: true' <<<"$text"; return 1; }
  ! sed 's/#.*//' <<<"$text" | grep -n 'SYS_ADMIN'
}

rendered=$(mktemp /tmp/switchyard-chart-privileges.XXXXXX)
without_mount=$(mktemp /tmp/switchyard-chart-privileges.XXXXXX)
# The renders the checks read: a failed render must fail the script, not leave an empty file
# that some "nothing is there" checks would pass on.
render >"$rendered" || { echo "helm template of $chart failed" >&2; exit 1; }
render --set agent.mountBpfFilesystem=false >"$without_mount" ||
  { echo "helm template of $chart with agent.mountBpfFilesystem=false failed" >&2; exit 1; }

check "the agent container adds exactly BPF, PERFMON, NET_ADMIN, NET_RAW, SYS_RESOURCE, SYS_NICE, each with why" \
  agent_capabilities_are_exactly "$rendered"
check "the init container mounts bpffs (Bidirectional) and the agent sees it HostToContainer" \
  bpf_filesystem_mounts_as_measured "$rendered"
check "nothing but the bpffs init container is privileged, and nothing adds SYS_ADMIN" \
  only_the_init_container_is_privileged "$rendered"
check "agent.mountBpfFilesystem=false renders no init container and nothing privileged" \
  bash -c "! grep -q 'initContainers:' '$without_mount' && ! grep -q 'privileged: true' '$without_mount'"
check "the values schema rejects a non-boolean mountBpfFilesystem" \
  bash -c "$(declare -f render); helm='$helm' chart='$chart'; \
    if errors=\$(render --set agent.mountBpfFilesystem=maybe 2>&1 >/dev/null); then exit 1; fi; \
    grep -q 'agent.mountBpfFilesystem: Invalid type' <<<\"\$errors\""
# The checks above see what they guard against.
check "the capability check sees SYS_ADMIN added back" \
  bash -c "$(declare -f daemonset container added_capabilities expected_capabilities agent_capabilities_are_exactly); \
    ! agent_capabilities_are_exactly <(sed 's/^\( *\)- SYS_NICE .*/&\n\1- SYS_ADMIN     # why/' '$rendered')"
check "the capability check sees a capability without its comment" \
  bash -c "$(declare -f daemonset container added_capabilities expected_capabilities agent_capabilities_are_exactly); \
    ! agent_capabilities_are_exactly <(sed 's/^\( *- NET_RAW\) .*/\1/' '$rendered')"
check "the capability check sees a flow list" \
  bash -c "$(declare -f daemonset container added_capabilities expected_capabilities agent_capabilities_are_exactly); \
    ! agent_capabilities_are_exactly <(sed 's/^\( *\)add:$/\1add: [BPF, PERFMON, NET_ADMIN, NET_RAW, SYS_RESOURCE, SYS_NICE, SYS_ADMIN]/' '$rendered')"
check "the privilege check sees SYS_ADMIN added" \
  bash -c "$(declare -f only_the_init_container_is_privileged); \
    ! only_the_init_container_is_privileged <(sed 's/^\( *\)- SYS_NICE .*/&\n\1- SYS_ADMIN/' '$rendered')"
check "the privilege check sees a privileged agent" \
  bash -c "$(declare -f only_the_init_container_is_privileged); \
    ! only_the_init_container_is_privileged <(sed 's/privileged: false/privileged: true/' '$rendered')"

echo "chart privileges: $passed passed, $failed failed"
[ "$failed" = 0 ]
