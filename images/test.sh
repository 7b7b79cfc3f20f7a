#!/usr/bin/env bash
# The images test (`make images-test`): builds the images twice and checks that
#  - the two builds give byte-identical archives (the second reuses the first's
#    binaries but redoes the whole assembly, from unpacking the .debs on);
#  - skopeo and umoci read them, containerd imports them as `kind load image-archive`
#    does (under the names the chart expects), and each carries the
#    org.opencontainers.image labels;
#  - the operator runs as a numeric non-root user that its /etc/passwd names, and its
#    image holds no ELF file but its binary and the libraries `ldd` says it needs;
#  - the agent's image holds iptables and ip6tables of both backends, nft and ip, and
#    they work: rules with the matches and targets kube-proxy uses are added, saved and
#    restored, in a network namespace of the test's own (the host's rules are never
#    touched);
#  - both binaries start in their images (their shared libraries are all there).
# Prints both archives' sizes and sha256s.
#
# Usage: images/test.sh [--once --binaries DIR]
#   --once --binaries DIR  one build from DIR's binaries (e.g. the debug ones, whose
#                          debug information is stripped first), written to
#                          target/images/check, with every check but the
#                          reproducibility one.
set -euo pipefail
cd "$(dirname "$0")/.."

once=false
binaries_dir=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        --once) once=true; shift ;;
        --binaries) binaries_dir=$(realpath "$2"); shift 2 ;;
        *) echo "usage: images/test.sh [--once --binaries DIR]" >&2; exit 2 ;;
    esac
done
if [[ "$once" == true && -z "$binaries_dir" ]]; then
    echo "images-test: --once needs --binaries" >&2
    exit 2
fi

TEST_PACKAGES=(skopeo umoci containerd jq binutils util-linux coreutils)
missing=()
for package in "${TEST_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'install ok installed' || missing+=("$package")
done
if [[ ${#missing[@]} -gt 0 ]]; then
    echo "images-test: installing Debian packages: ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

failures=0
fail() { echo "images-test: FAIL: $*" >&2; failures=$((failures + 1)); }
pass() { echo "images-test: ok: $*"; }

# One commit time and revision for both builds: other work may commit in between.
export SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct)}"
export SWITCHYARD_IMAGE_REVISION="${SWITCHYARD_IMAGE_REVISION:-$(git rev-parse HEAD)}"
images_dir=target/images
[[ "$once" == true ]] && images_dir=target/images/check
test_dir="$images_dir/test"
rm -rf "$test_dir"
mkdir -p "$test_dir"

timed_build() {
    local label=$1
    shift
    local started=$SECONDS
    bash images/build.sh --output-dir "$images_dir" "$@"
    echo "images-test: $label build took $((SECONDS - started)) s"
}

if [[ "$once" == true ]]; then
    # Debug binaries are ~90% debug information, which no check reads: strip it, so
    # the assembly compresses tens of megabytes, not hundreds.
    mkdir -p "$test_dir/binaries"
    for binary in switchyard-agent switchyard-operator; do
        objcopy --strip-debug "$binaries_dir/$binary" "$test_dir/binaries/$binary"
    done
    timed_build "the" --binaries "$test_dir/binaries"
else
    timed_build "first" ${binaries_dir:+--binaries "$binaries_dir"}
    mkdir -p "$test_dir/first" "$test_dir/binaries"
    cp "$images_dir"/switchyard-{agent,operator}.oci.tar "$test_dir/first/"
    cp --preserve=mode,timestamps "$images_dir"/work/binaries/switchyard-{agent,operator} "$test_dir/binaries/"
    rm -f "$images_dir"/switchyard-{agent,operator}.oci.tar
    timed_build "second" --binaries "$test_dir/binaries"
    for image in agent operator; do
        first=$(sha256sum <"$test_dir/first/switchyard-$image.oci.tar" | cut -d' ' -f1)
        second=$(sha256sum <"$images_dir/switchyard-$image.oci.tar" | cut -d' ' -f1)
        echo "images-test: switchyard-$image.oci.tar sha256 first build $first, second build $second"
        if [[ "$first" == "$second" ]]; then
            pass "switchyard-$image.oci.tar is byte-identical in both builds"
        else
            fail "switchyard-$image.oci.tar differs between two builds of the same commit"
        fi
    done
fi

for image in agent operator; do
    archive="$images_dir/switchyard-$image.oci.tar"
    echo "images-test: switchyard-$image.oci.tar is $(stat -c %s "$archive") bytes ($(du -h --apparent-size "$archive" | cut -f1))"
done

expected_created=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)
expected_version=$(cargo metadata --no-deps --format-version 1 --locked \
    | jq -r '.packages[] | select(.name == "switchyard-agent") | .version')
for image in agent operator; do
    archive="$images_dir/switchyard-$image.oci.tar"
    if ! config=$(skopeo inspect --config "oci-archive:$archive"); then
        fail "skopeo cannot read $archive"
        continue
    fi
    echo "$config" >"$test_dir/$image.config.json"
    failures_before=$failures
    for key in title description version revision created source licenses; do
        value=$(jq -r --arg key "org.opencontainers.image.$key" '.config.Labels[$key] // ""' <<<"$config")
        [[ -n "$value" ]] || fail "switchyard-$image has no org.opencontainers.image.$key label"
    done
    [[ $(jq -r '.config.Labels["org.opencontainers.image.title"]' <<<"$config") == "switchyard-$image" ]] \
        || fail "switchyard-$image's title label is not switchyard-$image"
    [[ $(jq -r '.config.Labels["org.opencontainers.image.created"]' <<<"$config") == "$expected_created" ]] \
        || fail "switchyard-$image's created label is not the commit time $expected_created"
    [[ $(jq -r '.created' <<<"$config") == "$expected_created" ]] \
        || fail "switchyard-$image's created time is not the commit time $expected_created"
    [[ $(jq -r '.config.Labels["org.opencontainers.image.revision"]' <<<"$config") == "$SWITCHYARD_IMAGE_REVISION" ]] \
        || fail "switchyard-$image's revision label is not $SWITCHYARD_IMAGE_REVISION"
    [[ $(jq -r '.config.Labels["org.opencontainers.image.version"]' <<<"$config") == "$expected_version" ]] \
        || fail "switchyard-$image's version label is not $expected_version"
    [[ $(jq -r '.config.Entrypoint | join(" ")' <<<"$config") == "/usr/local/bin/switchyard-$image" ]] \
        || fail "switchyard-$image's entrypoint is not /usr/local/bin/switchyard-$image"
    [[ $failures -eq $failures_before ]] \
        && pass "switchyard-$image carries the org.opencontainers.image labels, created $expected_created"

    # Each layer as the build writes it: entries in sorted order, owned by 0:0, no
    # time after the commit's.
    for layer in $(skopeo inspect --raw "oci-archive:$archive" | jq -r '.layers[].digest'); do
        listing=$(tar -xOf "$archive" "blobs/sha256/${layer#sha256:}" | TZ=UTC tar -tzv --numeric-owner --full-time)
        names=$(awk '{sub(/\/$/, "", $6); print $6}' <<<"$listing")
        LC_ALL=C sort --check=quiet <<<"$names" || fail "switchyard-$image's layer $layer is not in sorted order"
        owners=$(awk '$2 != "0/0" {print $6 " " $2}' <<<"$listing")
        [[ -z "$owners" ]] || fail "switchyard-$image's layer $layer has entries not owned by 0/0: $(head -n 3 <<<"$owners")"
        latest=$(awk '{print $4 " " $5}' <<<"$listing" | sort | tail -n 1)
        [[ $(date -u -d "$latest UTC" +%s) -le "$SOURCE_DATE_EPOCH" ]] \
            || fail "switchyard-$image's layer $layer has an entry from $latest, after SOURCE_DATE_EPOCH"
    done

    # skopeo copy is how users load or push the archive; umoci unpacks what it copied.
    layout="$test_dir/$image-layout"
    skopeo copy -q "oci-archive:$archive" "oci:$layout:test" || { fail "skopeo cannot copy $archive"; continue; }
    umoci unpack --image "$layout:test" "$test_dir/$image-bundle" >/dev/null \
        || { fail "umoci cannot unpack switchyard-$image"; continue; }
done

agent_root="$test_dir/agent-bundle/rootfs"
operator_root="$test_dir/operator-bundle/rootfs"
# Runs a command (chroot into the image) in a network, mount and PID namespace of its own, with
# /proc mounted in the image, as a container runtime would.
in_image() {
    local root=$1
    shift
    unshare --net --mount --pid --fork --mount-proc="$root/proc" "$@"
}

# The operator: a numeric non-root user, known to its /etc/passwd, that can run it.
operator_user=$(jq -r '.config.User' "$test_dir/operator.config.json")
if [[ "$operator_user" =~ ^([0-9]+):([0-9]+)$ && "${BASH_REMATCH[1]}" -ne 0 && "${BASH_REMATCH[2]}" -ne 0 ]]; then
    uid=${BASH_REMATCH[1]}
    gid=${BASH_REMATCH[2]}
    if awk -F: -v uid="$uid" -v gid="$gid" '$3 == uid && $4 == gid {found = 1} END {exit !found}' "$operator_root/etc/passwd"; then
        pass "the operator runs as $operator_user, which its /etc/passwd names"
    else
        fail "the operator's user $operator_user is not in its /etc/passwd"
    fi
    if output=$(in_image "$operator_root" chroot --userspec="$uid:$gid" "$operator_root" /usr/local/bin/switchyard-operator --help 2>&1); then
        pass "switchyard-operator starts in its image as $operator_user"
    else
        fail "switchyard-operator does not start in its image as $operator_user: $output"
    fi
else
    fail "the operator's user is '$operator_user', not numeric uid:gid other than root"
fi
[[ $(jq -r '.config.User' "$test_dir/agent.config.json") == "0:0" ]] || fail "the agent does not run as 0:0"

# The operator's ELF files: its binary and what the host's ldd says it links, nothing else.
operator_binary="$operator_root/usr/local/bin/switchyard-operator"
expected_elves=$( (echo switchyard-operator; ldd "$operator_binary" | awk '$1 != "linux-vdso.so.1" {print ($3 ~ /^\// ? $3 : $1)}' \
    | xargs -n1 readlink -f | xargs -n1 basename) | sort -u)
found_elves=$(find "$operator_root" -type f -exec sh -c 'head -c4 "$1" | grep -q "ELF" && basename "$1"' _ {} \; | sort -u)
if [[ "$expected_elves" == "$found_elves" ]]; then
    pass "the operator image's ELF files are its binary and the libraries ldd lists: $(echo $found_elves)"
else
    fail "the operator image's ELF files are [$(echo $found_elves)], ldd says [$(echo $expected_elves)]"
fi
for root in "$agent_root" "$operator_root"; do
    for program in bin/sh usr/bin/sh bin/bash usr/bin/apt usr/bin/dpkg; do
        [[ ! -e "$root/$program" && ! -L "$root/$program" ]] || fail "$root holds /$program"
    done
done

# The agent's tools, each by the name the agent runs it under.
if output=$(in_image "$agent_root" chroot "$agent_root" /usr/local/bin/switchyard-agent --help 2>&1); then
    pass "switchyard-agent starts in its image"
else
    fail "switchyard-agent does not start in its image: $output"
fi
for family in iptables ip6tables; do
    for backend in legacy nft; do
        for suffix in "" -save -restore; do
            program="$family-$backend$suffix"
            expected="($backend)"
            [[ "$backend" == nft ]] && expected="(nf_tables)"
            if output=$(in_image "$agent_root" chroot "$agent_root" "$program" --version 2>&1) && [[ "$output" == *"$expected"* ]]; then
                :
            else
                fail "$program does not run in the agent's image: $output"
            fi
        done
    done
done
failures_before=$failures
# Every program the agent's code names (`Command::new("...")`, `Tools::run("...")`) is
# on the image's PATH: a program added to the agent must be added to the image too.
named_programs=$(grep -rhoE 'Command::new\("[^"]+"\)|\.run\(\s*"[^"]+"' node-agent/src | grep -oE '"[^"]+"' | tr -d '"' | sort -u)
[[ -n "$named_programs" ]] || fail "found no program named in node-agent/src (has the way it runs programs changed?)"
for program in $named_programs; do
    found=false
    for directory in usr/local/sbin usr/local/bin usr/sbin usr/bin sbin bin; do
        [[ -x "$agent_root/$directory/$program" ]] && found=true
    done
    [[ "$found" == true ]] || fail "the agent runs $program (node-agent/src), which is not on its image's PATH"
done
plain=$(in_image "$agent_root" chroot "$agent_root" iptables --version 2>&1 || true)
[[ "$plain" == *"(nf_tables)"* ]] || fail "plain iptables is not Debian's default nf_tables backend: $plain"
nft_version=$(in_image "$agent_root" chroot "$agent_root" nft --version 2>&1 || true)
[[ "$nft_version" == nftables* ]] || fail "nft does not run in the agent's image: $nft_version"
ip_version=$(in_image "$agent_root" chroot "$agent_root" ip -V 2>&1 || true)
[[ "$ip_version" == *iproute2* && "$ip_version" != *"Couldn't"* ]] || fail "ip does not run cleanly in the agent's image: $ip_version"
[[ $failures -eq $failures_before ]] && pass "the agent's image runs iptables and ip6tables (legacy and nf_tables, save and restore), nft ($nft_version) and ip"

# Rules as the agent and kube-proxy write them, in the test's own network namespace.
cat >"$test_dir/rules.sh" <<'EOF'
set -euo pipefail
root=$1
run() { chroot "$root" "$@"; }
for backend in legacy nft; do
    run "iptables-$backend" -w -t nat -N SWITCHYARD-POSTROUTING
    run "iptables-$backend" -w -t nat -A SWITCHYARD-POSTROUTING -m mark --mark 0x4000/0x4000 -j MASQUERADE
    run "iptables-$backend" -w -t nat -A POSTROUTING -j SWITCHYARD-POSTROUTING
    run "iptables-$backend" -w -t filter -A FORWARD -m conntrack --ctstate INVALID -m comment --comment "kube-forward test" -j DROP
    run "iptables-$backend" -w -t nat -A PREROUTING -p tcp -d 10.96.0.10/32 --dport 53 -m statistic --mode random --probability 0.5 -j DNAT --to-destination 10.0.0.1:53
    run "ip6tables-$backend" -w -t nat -A POSTROUTING -m mark --mark 0x4000/0x4000 -j MASQUERADE
    saved=$(run "iptables-$backend-save")
    grep -q -- '-A SWITCHYARD-POSTROUTING -m mark --mark 0x4000/0x4000 -j MASQUERADE' <<<"$saved"
    grep -q -- '-m conntrack --ctstate INVALID' <<<"$saved"
    grep -q -- '-m statistic --mode random --probability 0.5' <<<"$saved"
    printf '*nat\n-D POSTROUTING -j SWITCHYARD-POSTROUTING\n-F SWITCHYARD-POSTROUTING\n-X SWITCHYARD-POSTROUTING\nCOMMIT\n' \
        | run "iptables-$backend-restore" --noflush -w 5
    saved=$(run "iptables-$backend-save")
    if grep -q SWITCHYARD <<<"$saved"; then
        echo "$backend: the restore left SWITCHYARD chains"
        exit 1
    fi
    grep -q -- '-m statistic' <<<"$saved"
    saved=$(run "ip6tables-$backend-save")
    grep -q -- '-A POSTROUTING -m mark --mark 0x4000/0x4000 -j MASQUERADE' <<<"$saved"
    echo "$backend: added, saved and restored"
done
printf 'add table ip switchyard-test\nadd chain ip switchyard-test postrouting { type nat hook postrouting priority 100; }\nadd rule ip switchyard-test postrouting meta mark 0x4000 masquerade\n' \
    | run nft -f -
# Captured first: `grep -q` leaving early must not fail the writer with SIGPIPE.
ruleset=$(run nft -j list ruleset)
grep -q '"name": "switchyard-test"' <<<"$ruleset"
addresses=$(run ip -j addr show)
grep -q '"ifname":"lo"' <<<"$addresses"
links=$(run ip -o link show)
grep -q '^1: lo:' <<<"$links"
echo "nft and ip: ok"
EOF
if output=$(in_image "$agent_root" bash "$test_dir/rules.sh" "$agent_root" 2>&1); then
    pass "the agent's image adds, saves and restores rules of both backends and families, and nft's and ip's ($(grep -v '^# Warning' <<<"$output" | tr '\n' ' '))"
else
    fail "the agent's image cannot do what the agent does with the rules: $output"
fi

# containerd, as `ctr -n k8s.io images import` and `kind load image-archive` use it: a
# daemon of the test's own (its own root, state and socket, no CRI plugin, in a
# network namespace of its own), stopped when the test ends.
containerd_dir="$PWD/$test_dir/containerd"
mkdir -p "$containerd_dir"
cat >"$containerd_dir/config.toml" <<CONFIG
version = 2
root = "$containerd_dir/root"
state = "$containerd_dir/state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "$containerd_dir/containerd.sock"
[ttrpc]
  address = "$containerd_dir/containerd.sock.ttrpc"
CONFIG
unshare --net containerd --config "$containerd_dir/config.toml" >"$containerd_dir/containerd.log" 2>&1 &
containerd_pid=$!
trap 'kill "$containerd_pid" 2>/dev/null || true' EXIT
in_containerd() { ctr --address "$containerd_dir/containerd.sock" --namespace k8s.io "$@"; }
deadline=$((SECONDS + 30))
until in_containerd version >/dev/null 2>&1; do
    if [[ $SECONDS -ge $deadline ]] || ! kill -0 "$containerd_pid" 2>/dev/null; then
        fail "containerd did not start: $(tail -n 5 "$containerd_dir/containerd.log")"
        break
    fi
    sleep 0.2
done
registry="${SWITCHYARD_IMAGE_REGISTRY:-ghcr.io/switchyard}"
for image in agent operator; do
    name="$registry/switchyard-$image:$expected_version"
    # kind load image-archive pipes the archive into this very command.
    if ! output=$(in_containerd images import --all-platforms --digests --snapshotter native - \
        <"$images_dir/switchyard-$image.oci.tar" 2>&1); then
        fail "containerd does not import switchyard-$image.oci.tar: $output"
    elif ! images=$(in_containerd images ls --quiet) || ! grep -qxF "$name" <<<"$images"; then
        fail "containerd imported switchyard-$image.oci.tar, but not as $name: $(tr '\n' ' ' <<<"$images")"
    else
        pass "containerd imports and unpacks switchyard-$image.oci.tar as $name"
    fi
done
kill "$containerd_pid"
wait "$containerd_pid" 2>/dev/null || true
trap - EXIT
rm -rf "$containerd_dir"

if [[ "$failures" -ne 0 ]]; then
    echo "images-test: $failures failures" >&2
    exit 1
fi
echo "images-test: all checks passed"
