# The operator (operator/) against a real Kubernetes 1.20 API server (e2e/cluster).
# Unit and in-process tests run with `cargo test`; this suite needs the local cluster.
.PHONY: e2e-operator-smoke

e2e-operator-smoke: setup
	bash operator/scripts/e2e-smoke.sh

# About 4.5 minutes (builds ~35 s, cluster up ~25 s, eight scenarios ~210 s). Passed its
# last four full runs (as it grew from six to eight scenarios); one other run was killed from
# outside by another suite's teardown (a stale namespace list, fixed in e2e/cluster).
TEST_SUITES += e2e-operator-smoke
