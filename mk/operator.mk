# The operator (operator/) against a real Kubernetes 1.20 API server (e2e/cluster).
# Unit and in-process tests run with `cargo test`; this suite needs the local cluster.
.PHONY: e2e-operator-smoke

e2e-operator-smoke: setup
	bash operator/scripts/e2e-smoke.sh

# About 3.5 minutes (cluster up ~30 s, seven scenarios ~170 s); passed three full runs in a row.
TEST_SUITES += e2e-operator-smoke
