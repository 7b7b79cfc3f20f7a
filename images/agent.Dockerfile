# Switchyard node agent. Build from the repository root:
#   docker build -f images/agent.Dockerfile -t switchyard-agent:dev .
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
# The kernel programs need the nightly with rust-src and bpf-linker built against
# the nightly's own LLVM: the same script CI runs.
RUN apt-get update && apt-get install -y --no-install-recommends sudo \
 && bash scripts/setup.sh \
 && cargo build --locked --release -p switchyard-agent

FROM debian:bookworm-slim
# iptables (both backends) and nftables: the agent keeps its own rules first and
# cleans kube-proxy's rules when told to. iproute2: `ip -j addr`, the host's
# interfaces and addresses (re-read on every netlink notification).
RUN apt-get update \
 && apt-get install -y --no-install-recommends iptables nftables iproute2 ca-certificates \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/switchyard-agent /usr/local/bin/switchyard-agent
ENTRYPOINT ["/usr/local/bin/switchyard-agent"]
CMD ["run"]
