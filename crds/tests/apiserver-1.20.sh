#!/usr/bin/env bash
# The committed CRDs against a real Kubernetes 1.20 API server (etcd + kube-apiserver only):
# accepted as structural, served, defaults applied by the server, enums and int-or-string
# enforced, the status subresource on, printer columns shown, `kubectl explain` readable, and
# the statuses the planner publishes accepted as they are.
#
#   bash crds/tests/apiserver-1.20.sh      (`make crds-apiserver`; binaries from `make e2e-build`)
#
# Everything runs inside private network, PID and mount namespaces: the API server listens on
# the namespace's own loopback only, and when the script ends (also on failure) the PID
# namespace takes every process with it and the tmpfs work directory disappears.
set -euo pipefail

K8S_BIN="${SWITCHYARD_K8S_CACHE:-${SWITCHYARD_CACHE:-$HOME/.cache/switchyard}/k8s-1.20.2}/bin"
CRDS="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/switchyard.dev_crds.yaml"

log() { printf 'crds-apiserver: %s\n' "$*" >&2; }
fail() { printf 'crds-apiserver: failed to %s\n' "$*" >&2; exit 1; }

if [ "${SWITCHYARD_CRDS_INSIDE:-}" != 1 ]; then
  for binary in etcd kube-apiserver kubectl; do
    [ -x "$K8S_BIN/$binary" ] || fail "find $K8S_BIN/$binary (run make e2e-build)"
  done
  # The statuses the planner publishes in typical situations, to write through the server.
  statuses=$(mktemp /tmp/switchyard-planner-statuses.XXXXXX)
  (cd "$(dirname "$CRDS")/.." && "${CARGO:-cargo}" run --quiet --locked -p switchyard-operator --example planner_statuses) >"$statuses" \
    || { rm -f "$statuses"; fail "print the planner's statuses (cargo run --example planner_statuses)"; }
  exec unshare --net --pid --mount --fork --kill-child --mount-proc \
    env SWITCHYARD_CRDS_INSIDE=1 SWITCHYARD_PLANNER_STATUSES="$statuses" bash "${BASH_SOURCE[0]}" "$@"
fi

PLANNER_STATUSES=$(cat "$SWITCHYARD_PLANNER_STATUSES")
rm -f "$SWITCHYARD_PLANNER_STATUSES"

WORK=/tmp/switchyard-crds-apiserver
mkdir -p "$WORK"
mount -t tmpfs -o mode=0700 switchyard-crds "$WORK"
ip link set lo up

failed_line=""
trap 'failed_line=$LINENO' ERR
finish() {
  local status=$?
  if [ "$status" != 0 ]; then
    log "failed (exit $status${failed_line:+, at line $failed_line})"
    for component in etcd kube-apiserver; do
      log "last lines of $component:"
      tail -n 15 "$WORK/$component.log" >&2 || true
    done
  fi
  # Stop the daemons before their files go (the PID namespace would end them anyway).
  kill $(jobs -p) 2>/dev/null || true
  wait 2>/dev/null || true
  umount "$WORK" 2>/dev/null || true
  rmdir "$WORK" 2>/dev/null || true
}
trap finish EXIT

"$K8S_BIN/etcd" --name crds --data-dir "$WORK/etcd" \
  --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
  --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
  --initial-cluster crds=http://127.0.0.1:2380 >"$WORK/etcd.log" 2>&1 &

openssl genrsa -out "$WORK/service-account.key" 2048 2>/dev/null
openssl rsa -in "$WORK/service-account.key" -pubout -out "$WORK/service-account.pub" 2>/dev/null
TOKEN=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
echo "$TOKEN,switchyard-crds-admin,switchyard-crds-admin,system:masters" >"$WORK/tokens.csv"

"$K8S_BIN/kube-apiserver" \
  --etcd-servers=http://127.0.0.1:2379 \
  --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port=6443 --insecure-port=0 \
  --cert-dir="$WORK/certs" --token-auth-file="$WORK/tokens.csv" --authorization-mode=RBAC \
  --service-cluster-ip-range=10.96.0.0/16 \
  --service-account-issuer=https://kubernetes.default.svc.cluster.local \
  --service-account-key-file="$WORK/service-account.pub" \
  --service-account-signing-key-file="$WORK/service-account.key" \
  --api-audiences=https://kubernetes.default.svc.cluster.local \
  --endpoint-reconciler-type=none --profiling=false --v=1 >"$WORK/kube-apiserver.log" 2>&1 &

kubectl() {
  "$K8S_BIN/kubectl" --server=https://127.0.0.1:6443 --insecure-skip-tls-verify --token="$TOKEN" "$@"
}

for attempt in $(seq 1 120); do
  kubectl get --raw /readyz >/dev/null 2>&1 && break
  [ "$attempt" = 120 ] && fail "see the API server ready within 60 s"
  sleep 0.5
done
log "API server $(kubectl version -o json 2>/dev/null | jq -r .serverVersion.gitVersion) ready"

expect_equal() {
  local what=$1 expected=$2 actual=$3
  [ "$expected" = "$actual" ] || fail "$what: expected '$expected', got '$actual'"
}

expect_rejected() {
  local what=$1 manifest=$2 output
  # --validate=false: the API server itself must refuse, not kubectl's client-side check.
  if output=$(kubectl apply --validate=false -f - <<<"$manifest" 2>&1); then
    fail "reject $what (the server accepted it: $output)"
  fi
  log "rejected as expected: $what: $(head -n 1 <<<"$output")"
}

# 1. Both CRDs are accepted, structural and established.
kubectl apply -f "$CRDS" >/dev/null || fail "apply $CRDS"
for crd in dataplaneconfigs.switchyard.dev dataplanenodes.switchyard.dev; do
  kubectl wait --for=condition=Established --timeout=30s "crd/$crd" >/dev/null || fail "see $crd established"
  non_structural=$(kubectl get "crd/$crd" -o jsonpath='{.status.conditions[?(@.type=="NonStructuralSchema")].status}')
  expect_equal "$crd NonStructuralSchema condition" "" "$non_structural"
done
log "both CRDs accepted and established"

# 2. The server applies the schema's defaults to a minimal object.
kubectl apply -f - >/dev/null <<'YAML' || fail "create a minimal DataplaneConfig"
apiVersion: switchyard.dev/v1alpha1
kind: DataplaneConfig
metadata:
  name: default
spec:
  mode: Ebpf
YAML
spec() { kubectl get dataplaneconfig default -o jsonpath="{.spec.$1}"; }
expect_equal "default paused" false "$(spec paused)"
expect_equal "default iptablesCleanup" Auto "$(spec iptablesCleanup)"
expect_equal "default kubeProxy.management" Managed "$(spec kubeProxy.management)"
expect_equal "default kubeProxy.namespace" kube-system "$(spec kubeProxy.namespace)"
expect_equal "default kubeProxy.daemonSetName" kube-proxy "$(spec kubeProxy.daemonSetName)"
expect_equal "default rollout.maxUnavailable" 1 "$(spec rollout.maxUnavailable)"
expect_equal "default rollout.nodeReadyTimeoutSeconds" 300 "$(spec rollout.nodeReadyTimeoutSeconds)"
expect_equal "default rollout.maxFailedNodes" 0 "$(spec rollout.maxFailedNodes)"
expect_equal "default rollout.drainTimeoutSeconds" 600 "$(spec rollout.drainTimeoutSeconds)"
# The canary is opt-in: a spec without one gets none (no soak, batches of maxUnavailable).
expect_equal "no default rollout.canary" "" "$(spec rollout.canary)"
expect_equal "default rollout.onBudgetExceeded" Rollback "$(spec rollout.onBudgetExceeded)"
expect_equal "default rollout.disruptionBudget.failedConnectsPerMinute" 30 "$(spec rollout.disruptionBudget.failedConnectsPerMinute)"
expect_equal "default rollout.disruptionBudget.failedConnectsPercent" 100 "$(spec rollout.disruptionBudget.failedConnectsPercent)"
kubectl get dpc default >/dev/null || fail "find the DataplaneConfig by its short name dpc"
# Control: a canary given as {} gets its own defaults: a soak of 60 s, and no count (absent:
# one node; a defaulted count would clash with a nodeSelector given alone).
kubectl apply -f - >/dev/null <<'YAML' || fail "create a DataplaneConfig with canary: {}"
apiVersion: switchyard.dev/v1alpha1
kind: DataplaneConfig
metadata:
  name: empty-canary
spec:
  mode: Ebpf
  rollout:
    canary: {}
YAML
empty_canary() { kubectl get dpc empty-canary -o jsonpath="{.spec.rollout.canary.$1}"; }
expect_equal "canary {} soakSeconds" 60 "$(empty_canary soakSeconds)"
expect_equal "canary {} count (absent: one node)" "" "$(empty_canary count)"
expect_equal "canary {} nodeSelector" "" "$(empty_canary nodeSelector)"
log "defaults applied by the server"

kubectl apply -f - >/dev/null <<'YAML' || fail "create a minimal DataplaneNode"
apiVersion: switchyard.dev/v1alpha1
kind: DataplaneNode
metadata:
  name: node-1
spec:
  mode: KubeProxy
YAML
expect_equal "DataplaneNode default drainTimeoutSeconds" 600 "$(kubectl get dpn node-1 -o jsonpath='{.spec.drainTimeoutSeconds}')"
expect_equal "DataplaneNode default iptablesCleanup" false "$(kubectl get dpn node-1 -o jsonpath='{.spec.iptablesCleanup}')"

# 3. int-or-string, enums and ranges are enforced.
kubectl apply -f - >/dev/null <<'YAML' || fail "accept maxUnavailable as a percentage"
apiVersion: switchyard.dev/v1alpha1
kind: DataplaneConfig
metadata:
  name: percent
spec:
  mode: KubeProxy
  rollout:
    maxUnavailable: 25%
YAML
expect_equal "maxUnavailable percentage" "25%" "$(kubectl get dpc percent -o jsonpath='{.spec.rollout.maxUnavailable}')"
expect_rejected "an unknown mode" 'apiVersion: switchyard.dev/v1alpha1
kind: DataplaneConfig
metadata: {name: bad-mode}
spec: {mode: ebpf}'
expect_rejected "a missing mode" 'apiVersion: switchyard.dev/v1alpha1
kind: DataplaneConfig
metadata: {name: no-mode}
spec: {paused: true}'
expect_rejected "an unknown management" 'apiVersion: switchyard.dev/v1alpha1
kind: DataplaneConfig
metadata: {name: bad-management}
spec: {mode: Ebpf, kubeProxy: {management: Helm}}'
expect_rejected "a zero node ready timeout" 'apiVersion: switchyard.dev/v1alpha1
kind: DataplaneConfig
metadata: {name: bad-timeout}
spec: {mode: Ebpf, rollout: {nodeReadyTimeoutSeconds: 0}}'
expect_rejected "a negative drain timeout" 'apiVersion: switchyard.dev/v1alpha1
kind: DataplaneNode
metadata: {name: bad-drain}
spec: {mode: Ebpf, drainTimeoutSeconds: -1}'
expect_rejected "a canary count of 0" 'apiVersion: switchyard.dev/v1alpha1
kind: DataplaneConfig
metadata: {name: bad-canary}
spec: {mode: Ebpf, rollout: {canary: {count: 0}}}'
expect_rejected "a negative soak" 'apiVersion: switchyard.dev/v1alpha1
kind: DataplaneConfig
metadata: {name: bad-soak}
spec: {mode: Ebpf, rollout: {canary: {soakSeconds: -1}}}'
expect_rejected "a negative relative budget" 'apiVersion: switchyard.dev/v1alpha1
kind: DataplaneConfig
metadata: {name: bad-budget}
spec: {mode: Ebpf, rollout: {disruptionBudget: {failedConnectsPercent: -1}}}'
expect_rejected "an unknown onBudgetExceeded" 'apiVersion: switchyard.dev/v1alpha1
kind: DataplaneConfig
metadata: {name: bad-action}
spec: {mode: Ebpf, rollout: {onBudgetExceeded: Ignore}}'
expect_rejected "maxUnavailable of the wrong type" 'apiVersion: switchyard.dev/v1alpha1
kind: DataplaneConfig
metadata: {name: bad-max-unavailable}
spec: {mode: Ebpf, rollout: {maxUnavailable: true}}'

# 4. Status is a subresource: a status write leaves the spec alone; a bad condition is rejected.
generation=$(kubectl get dpn node-1 -o jsonpath='{.metadata.generation}')
kubectl patch dpn node-1 --subresource=status --type=merge -p '{"status":{"observedGeneration":1,"agentVersion":"0.1.0","agentRevision":"abc123","servicesProgrammed":3,"liveFlows":0,"lastSyncTime":"2026-01-01T00:00:00Z","conditions":[{"type":"Ready","status":"True","reason":"AgentReady","message":"","lastTransitionTime":"2026-01-01T00:00:00Z","observedGeneration":1}]},"spec":{"mode":"Ebpf"}}' >/dev/null \
  || fail "write the DataplaneNode status through the status subresource"
expect_equal "spec after a status write" KubeProxy "$(kubectl get dpn node-1 -o jsonpath='{.spec.mode}')"
expect_equal "generation after a status write" "$generation" "$(kubectl get dpn node-1 -o jsonpath='{.metadata.generation}')"
# The disruption signals an agent reports (issue 28): accepted, and a negative count is not.
kubectl patch dpn node-1 --subresource=status --type=merge -p '{"status":{"disruption":{"baseline":{"start":"2026-01-01T00:00:00Z","end":"2026-01-01T00:10:00Z","connections":{"failedConnects":3,"resetsByPeer":0},"probes":{"sent":600,"failures":0}},"current":{"start":"2026-01-01T00:10:05Z","end":"2026-01-01T00:11:05Z","datapath":{"translationErrors":0},"expected":{"sourceRangeDrops":12},"connections":{"failedConnects":120},"services":[{"namespace":"shop","name":"cart","failedConnects":118}]}}}}' >/dev/null \
  || fail "write a DataplaneNode status with disruption signals"
expect_equal "a reported failed connects count" 120 "$(kubectl get dpn node-1 -o jsonpath='{.status.disruption.current.connections.failedConnects}')"
if kubectl patch dpn node-1 --subresource=status --type=merge \
  -p '{"status":{"disruption":{"current":{"start":"2026-01-01T00:10:05Z","end":"2026-01-01T00:11:05Z","connections":{"failedConnects":-1}}}}}' >/dev/null 2>&1; then
  fail "reject a negative signal count"
fi
if kubectl patch dpn node-1 --subresource=status --type=merge \
  -p '{"status":{"conditions":[{"type":"Ready","status":"Maybe","reason":"AgentReady","lastTransitionTime":"2026-01-01T00:00:00Z"}]}}' >/dev/null 2>&1; then
  fail "reject a condition status other than True, False or Unknown"
fi
# Empty messages and zero counts: a 1.20 validator takes "" in an array item for null.
kubectl patch dpc default --subresource=status --type=merge -p '{"status":{"phase":"ActivatingNodes","servingSummary":"1/3","observedGeneration":1,"message":"","nodes":{"total":3,"serving":1,"kubeProxyRunning":3,"rulesCleaned":0,"agentUpToDate":0,"failed":0,"draining":0},"transition":{"from":"KubeProxy","to":"Ebpf","startedAt":"2026-01-01T00:00:00Z"},"conditions":[{"type":"Ready","status":"False","reason":"TransitionInProgress","message":"switching node-2","lastTransitionTime":"2026-01-01T00:00:00Z","observedGeneration":1},{"type":"Degraded","status":"False","reason":"AsExpected","message":"","lastTransitionTime":"2026-01-01T00:00:00Z","observedGeneration":0}]}}' >/dev/null \
  || fail "write the DataplaneConfig status"
if kubectl patch dpc default --subresource=status --type=merge -p '{"status":{"phase":"Done"}}' >/dev/null 2>&1; then
  fail "reject an unknown phase"
fi
log "status subresource on, conditions and phase validated"

# 5. Printer columns, and `kubectl wait --for=condition=...` on the standard condition shape.
# (Whole outputs are captured before they are cut: `kubectl ... | head` can die of SIGPIPE.)
table=$(kubectl get dpc default) || fail "list the DataplaneConfig"
expect_equal "dpc columns" "NAME MODE PHASE SERVING AGE" "$(sed -n 1p <<<"$table" | tr -s ' ')"
expect_equal "dpc row" "default Ebpf ActivatingNodes 1/3" "$(sed -n 2p <<<"$table" | tr -s ' ' | cut -d' ' -f1-4)"
table=$(kubectl get dpn node-1) || fail "list the DataplaneNode"
expect_equal "dpn columns" "NAME MODE READY CLEANUP AGENT" "$(sed -n 1p <<<"$table" | tr -s ' ')"
expect_equal "dpn row" "node-1 KubeProxy True false 0.1.0" "$(sed -n 2p <<<"$table" | tr -s ' ')"
kubectl wait --for=condition=Ready --timeout=5s dpn/node-1 >/dev/null || fail "kubectl wait for the Ready condition"
log "printer columns shown for dpc and dpn"

# 6. Every status the planner publishes is accepted as it is.
situations=0
while read -r line; do
  situation=$(jq -r .situation <<<"$line")
  patch=$(jq -c '{status: .status}' <<<"$line")
  output=$(kubectl patch dpc default --subresource=status --type=merge -p "$patch" 2>&1) \
    || fail "write the planner's status for the situation '$situation': $output"
  expect_equal "phase after writing the '$situation' status" "$(jq -r .status.phase <<<"$line")" \
    "$(kubectl get dpc default -o jsonpath='{.status.phase}')"
  situations=$((situations + 1))
done <<<"$PLANNER_STATUSES"
[ "$situations" -ge 7 ] || fail "find the planner's statuses (got $situations)"
log "the planner's status accepted in $situations situations"

# 7. `kubectl explain` reads the descriptions.
explained=$(kubectl explain dataplaneconfig.spec.rollout.drainTimeoutSeconds 2>&1) || fail "explain a field: $explained"
grep -q "detaches anyway" <<<"$explained" || fail "find the field's description in kubectl explain: $explained"
log "kubectl explain shows the descriptions"
log "every check passed"
