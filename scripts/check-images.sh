#!/usr/bin/env bash
# What can be checked of the container images on a machine without a container engine
# (no registry is reachable here, so the Dockerfiles' base images cannot be pulled):
#  - the operator binary needs only the C runtime that distroless/cc-debian12 ships;
#  - every program the agent runs is installed by a package that agent.Dockerfile names;
#  - each Dockerfile builds a package of this workspace that has that binary.
# Usage: scripts/check-images.sh OPERATOR_BINARY AGENT_BINARY
set -euo pipefail
cd "$(dirname "$0")/.."
operator_binary=$1
agent_binary=$2
failures=0
fail() { echo "images-check: $*" >&2; failures=$((failures + 1)); }

# distroless/cc-debian12 holds glibc (libc, libm, ...), libgcc_s and the loader.
distroless_cc='^(linux-vdso\.so\.1|libc\.so\.6|libm\.so\.6|libdl\.so\.2|libpthread\.so\.0|librt\.so\.1|libgcc_s\.so\.1|/lib64/ld-linux-x86-64\.so\.2)$'
while read -r library; do
    [[ -z "${library}" ]] && continue
    [[ "${library}" =~ ${distroless_cc} ]] || fail "switchyard-operator links ${library}, which distroless/cc-debian12 lacks"
done < <(ldd "${operator_binary}" | awk '{print $1}')

# The agent image is debian:bookworm-slim: all of glibc, nothing else by default.
while read -r library; do
    [[ -z "${library}" ]] && continue
    [[ "${library}" =~ ^(linux-vdso\.so\.1|lib(c|m|dl|pthread|rt|gcc_s)\.so\.[0-9]+|/lib64/ld-linux-x86-64\.so\.2)$ ]] \
        || fail "switchyard-agent links ${library}, which debian:bookworm-slim lacks"
done < <(ldd "${agent_binary}" | awk '{print $1}')

# The programs the agent runs (node-agent/src/kube_proxy and its own rules).
# Only the final stage's packages are in the image (the build stage's are not).
image_packages=$(awk '/^FROM/ {stage = ""} {stage = stage $0 "\n"} END {printf "%s", stage}' images/agent.Dockerfile \
    | grep -oE 'apt-get install -y --no-install-recommends [a-z0-9 .+-]+' \
    | sed 's/apt-get install -y --no-install-recommends//' | tr ' ' '\n' | grep -v '^$' | sort -u)
programs=(ip nft iptables)
for family in iptables ip6tables; do
    for backend in legacy nft; do
        for action in save restore; do programs+=("${family}-${backend}-${action}"); done
    done
done
for program in "${programs[@]}"; do
    path=$(command -v "${program}" || true)
    if [[ -z "${path}" ]]; then
        fail "${program} is not installed here (scripts/setup.sh installs it), cannot tell its package"
        continue
    fi
    package=$(dpkg -S "$(readlink -f "${path}")" 2>/dev/null | head -n1 | cut -d: -f1 || true)
    if [[ -z "${package}" ]]; then
        # Merged /usr: dpkg may know the file under /sbin or /bin only.
        resolved=$(readlink -f "${path}")
        package=$(dpkg -S "${resolved#/usr}" 2>/dev/null | head -n1 | cut -d: -f1 || true)
    fi
    grep -qx "${package}" <<<"${image_packages}" \
        || fail "the agent runs ${program} (package ${package:-unknown}), which images/agent.Dockerfile does not install"
done

for image in agent operator; do
    package=$(grep -oE 'cargo build --locked --release -p [a-z-]+' "images/${image}.Dockerfile" | awk '{print $NF}')
    [[ -n "${package}" ]] || fail "images/${image}.Dockerfile builds no workspace package"
    grep -q "^name = \"${package}\"" */Cargo.toml || fail "images/${image}.Dockerfile builds ${package}, which is not in the workspace"
    grep -q "target/release/${package}" "images/${image}.Dockerfile" || fail "images/${image}.Dockerfile does not copy the ${package} binary"
done

if [[ "${failures}" -ne 0 ]]; then
    exit 1
fi
echo "images-check: the operator needs only distroless/cc's C runtime; the agent image installs every program the agent runs (${#programs[@]} programs in: $(echo ${image_packages}))"
