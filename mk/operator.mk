# The operator (operator/) against a real Kubernetes 1.20 API server (e2e/cluster).
# Unit and in-process tests run with `cargo test`. Its cluster tests (leader election,
# CRD self-apply, Events on 1.20, Preflight) run in `make e2e-operator` on the migration
# scenarios' cluster; this target runs only them, on a cluster of their own, for a quick
# loop while working on the operator (not in TEST_SUITES: `e2e-operator` covers it).
.PHONY: e2e-operator-smoke

e2e-operator-smoke: setup
	bash operator/scripts/e2e-smoke.sh
