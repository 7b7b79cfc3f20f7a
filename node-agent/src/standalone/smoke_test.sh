#!/usr/bin/env bash
# End-to-end check of `switchyard-agent standalone` (make standalone-test).
# Re-executes itself in private network, mount and PID namespaces; builds a node
# with two pod namespaces (HTTP servers) on veths and an external client namespace;
# then drives the agent through manifest changes, a bad manifest, a restart, the
# DataplaneNode mode (KubeProxy drains and detaches, Ebpf attaches again) and
# --detach-on-exit. Traffic goes only to namespaces this script made.
# Usage: smoke_test.sh AGENT_BINARY
set -euo pipefail

AGENT=$(readlink -f "$1")
SELF=$(readlink -f "$0")
if [ -z "${SWITCHYARD_SMOKE_INSIDE:-}" ]; then
  [ "$(id -u)" = 0 ] || { echo "standalone-test needs root" >&2; exit 1; }
  exec env SWITCHYARD_SMOKE_INSIDE=1 unshare --net --mount --pid --fork --kill-child \
    --mount-proc --propagation private bash "$SELF" "$AGENT"
fi

WORK=$(mktemp -d /tmp/switchyard-standalone-test.XXXXXX)
PIN=$WORK/bpffs/switchyard
CGROUP_ROOT=$(awk '$3 == "cgroup2" {print $2; exit}' /proc/self/mounts)
CGROUP=$CGROUP_ROOT/switchyard-standalone-test-$(basename "$WORK")
# The external client runs outside the hooks' cgroup: on a real node it is another
# machine, and inside it the connect hook would take it for a pod.
OUTSIDE=$CGROUP-outside
AGENT_PID=
failures=0

cleanup() {
  set +e
  [ -n "$AGENT_PID" ] && kill -KILL "$AGENT_PID" 2>/dev/null
  echo $$ > "$CGROUP_ROOT/cgroup.procs" 2>/dev/null
  jobs -p | xargs -r kill 2>/dev/null
  wait 2>/dev/null
  "$AGENT" detach --bpf-pin-dir "$PIN" >/dev/null 2>&1
  rmdir "$CGROUP" "$OUTSIDE" 2>/dev/null
  for namespace in pod1 pod2 client; do ip netns del $namespace 2>/dev/null; done
  umount "$WORK/bpffs" 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT

check() { # check DESCRIPTION COMMAND...
  local description=$1; shift
  if "$@"; then echo "ok: $description"; else echo "FAILED: $description"; failures=$((failures + 1)); fi
}

get() { # get NAMESPACE|host URL: prints the answering pod or ERR
  local namespace=$1 url=$2
  local command=(python3 -c 'import sys, urllib.request
try: print(urllib.request.urlopen(sys.argv[1], timeout=2).read().decode().strip())
except Exception as error: print("ERR", error)' "$url")
  case $namespace in
    host) "${command[@]}" ;;
    client) (echo "$BASHPID" > "$OUTSIDE/cgroup.procs"; exec ip netns exec client "${command[@]}") ;;
    *) ip netns exec "$namespace" "${command[@]}" ;;
  esac
}

# Backends are chosen at random: COUNT requests all land on one of two backends in
# one run of 2^(COUNT-1), so a check that both answer asks at least 12 times (6 failed
# one CI run in 32).
answers() { # answers NAMESPACE URL COUNT: sorted distinct answers
  for _ in $(seq "$3"); do get "$1" "$2"; done | sort -u | tr '\n' ' ' | sed 's/ $//'
}

wait_for_log() { # wait_for_log FILE PATTERN SECONDS
  local deadline=$((SECONDS + $3))
  while [ $SECONDS -lt $deadline ]; do grep -q "$2" "$1" && return 0; sleep 0.2; done
  return 1
}

wait_for_log_command() { # wait_for_log_command SECONDS COMMAND...: until COMMAND succeeds
  local deadline=$((SECONDS + $1)); shift
  while [ $SECONDS -lt $deadline ]; do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
  return 1
}

links() { ls "$PIN/links" 2>/dev/null | grep -c '^tcx-\|^clsact-' || true; }

# The node.
mkdir -p "$WORK/bpffs" /run/netns
mount -t bpf bpf "$WORK/bpffs"
mount -t tmpfs tmpfs /run/netns
mkdir "$CGROUP" "$OUTSIDE"; echo $$ > "$CGROUP/cgroup.procs"
ip link set lo up
sysctl -qw net.ipv4.ip_forward=1
ip netns add client
ip link add eth0 type veth peer name ext0
ip link set ext0 netns client
ip addr add 192.168.50.1/24 dev eth0; ip link set eth0 up
ip -n client addr add 192.168.50.2/24 dev ext0; ip -n client link set ext0 up
ip -n client link set lo up; ip -n client route add default via 192.168.50.1
for index in 1 2; do
  ip netns add pod$index
  ip link add veth$index type veth peer name eth0 netns pod$index
  ip link set veth$index up
  ip -n pod$index addr add 10.0.0.$index/32 dev eth0
  ip -n pod$index link set eth0 up; ip -n pod$index link set lo up
  ip -n pod$index route add 169.254.1.1 dev eth0
  ip -n pod$index route add default via 169.254.1.1 dev eth0
  ip -n pod$index neigh add 169.254.1.1 lladdr "$(ip -j link show veth$index | jq -r '.[0].address')" dev eth0
  ip route add 10.0.0.$index/32 dev veth$index
  ip netns exec pod$index python3 -c 'import http.server, socketserver, sys
name = sys.argv[1].encode() + b"\n"
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.send_header("Content-Length", str(len(name))); self.end_headers(); self.wfile.write(name)
    def log_message(self, *arguments): pass
socketserver.ThreadingTCPServer.allow_reuse_address = True
socketserver.ThreadingTCPServer(("0.0.0.0", 8080), Handler).serve_forever()' pod$index &
done

mkdir "$WORK/manifests"
write_service() { # write_service NODE_PORT ENDPOINT...
  local node_port=$1; shift
  {
    printf 'apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec:\n  type: NodePort\n  clusterIP: 10.96.0.10\n'
    printf '  ports: [{name: http, port: 80, targetPort: web, nodePort: %s}]\n---\n' "$node_port"
    printf 'apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: web-1, labels: {kubernetes.io/service-name: web}}\n'
    printf 'addressType: IPv4\nports: [{name: http, port: 8080}]\nendpoints:\n'
    for endpoint in "$@"; do printf -- '- {addresses: [%s], nodeName: node-a}\n' "$endpoint"; done
  } > "$WORK/manifests/web.yaml.tmp"
  mv "$WORK/manifests/web.yaml.tmp" "$WORK/manifests/web.yaml"
}
write_mode() {
  printf 'apiVersion: switchyard.dev/v1alpha1\nkind: DataplaneNode\nmetadata: {name: node-a}\nspec: {mode: %s, drainTimeoutSeconds: 30}\n' "$1" \
    > "$WORK/manifests/node.yaml.tmp"
  mv "$WORK/manifests/node.yaml.tmp" "$WORK/manifests/node.yaml"
}
start_agent() { # start_agent LOG [FLAGS...]
  local log=$1; shift
  "$AGENT" standalone --manifests "$WORK/manifests" --node-name node-a --bpf-pin-dir "$PIN" \
    --cgroup "$CGROUP" --min-sync-period-ms 100 "$@" > "$log" 2>&1 &
  AGENT_PID=$!
}
stop_agent() {
  kill -TERM "$AGENT_PID"; wait "$AGENT_PID" || true; AGENT_PID=
}

write_service 30080 10.0.0.1 10.0.0.2
start_agent "$WORK/first.log" --no-masquerade-rule
check "the socket hooks are attached" wait_for_log "$WORK/first.log" "socket hooks attached" 10
check "a pod reaches the ClusterIP and every backend" test "$(answers pod2 http://10.96.0.10/ 12)" = "pod1 pod2"
check "a host process reaches the ClusterIP" test "$(answers host http://10.96.0.10/ 12)" = "pod1 pod2"
check "an external client reaches the NodePort" test "$(answers client http://192.168.50.1:30080/ 12)" = "pod1 pod2"
check "three interfaces have programs" test "$(links)" -ge 3
stop_agent
check "Services keep working with the agent stopped by SIGTERM" test "$(answers client http://192.168.50.1:30080/ 24)" = "pod1 pod2"

start_agent "$WORK/second.log" --detach-on-exit
# The agent restarts at the lowest CPU priority while it catches up: on a busy
# machine its first round can take several seconds, hence a generous deadline.
check "the masquerade rule is installed" wait_for_log_command 20 iptables -w -t nat -C SWITCHYARD-POSTROUTING -m mark --mark 0x4000/0x4000 -j MASQUERADE
check "a restarted agent writes nothing" wait_for_log "$WORK/second.log" "synced the maps.*operations=0" 10
sed -i 's/nodePort: 30080/nodePort: banana/' "$WORK/manifests/web.yaml"
check "a bad manifest is reported by file, document and field" \
  wait_for_log "$WORK/second.log" "web.yaml, document 1: field spec.ports\[0\].nodePort" 5
check "the last good state keeps serving" test "$(answers client http://192.168.50.1:30080/ 24)" = "pod1 pod2"
write_service 30080 10.0.0.1
check "a scaled-down Service is applied" wait_for_log "$WORK/second.log" "synced the maps.*operations=[1-9]" 5
check "only the remaining backend answers" test "$(answers client http://192.168.50.1:30080/ 8)" = "pod1"
write_mode KubeProxy
check "mode KubeProxy drains and detaches" wait_for_log "$WORK/second.log" "drained: programs detached" 10
check "no interface keeps a program" test "$(links)" = 0
write_mode Ebpf
check "mode Ebpf attaches again" wait_for_log "$WORK/second.log" "mode Ebpf: programs attached" 10
only_pod1_answers() { test "$(answers pod2 http://10.96.0.10/ 4)" = "pod1"; }
check "and serves again" wait_for_log_command 5 only_pod1_answers
stop_agent
check "--detach-on-exit removes every pin" test ! -e "$PIN"
check "--detach-on-exit removes the masquerade chain" bash -c '! iptables -w -t nat -S SWITCHYARD-POSTROUTING >/dev/null 2>&1'
check "--detach-on-exit leaves Services untranslated" test "$(answers client http://192.168.50.1:30080/ 1 | cut -c1-3)" = "ERR"

if [ $failures -gt 0 ]; then
  echo "== first agent"; cat "$WORK/first.log"; echo "== second agent"; cat "$WORK/second.log"
  echo "standalone-test: $failures check(s) failed"; exit 1
fi
echo "standalone-test: all checks passed"
