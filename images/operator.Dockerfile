# Switchyard operator. Build from the repository root:
#   docker build -f images/operator.Dockerfile -t switchyard-operator:dev .
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --locked --release -p switchyard-operator

# Non-root, read-only root filesystem: the operator needs nothing but its binary
# and the C runtime.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/switchyard-operator /usr/local/bin/switchyard-operator
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/switchyard-operator"]
