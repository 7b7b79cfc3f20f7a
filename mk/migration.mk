# The migration (issues 6 and 8): `make demo` switches a local 3-node cluster from
# kube-proxy to eBPF under traffic and leaves it up; `make e2e-migration` runs the
# migration scenarios (helm install, Ebpf and back, long-lived connections) on one.
.PHONY: demo demo-down e2e-migration

demo: setup
	bash e2e/scripts/demo.sh

demo-down:
	e2e/cluster down
	rm -f $(or $(SWITCHYARD_E2E_STATE),/var/lib/switchyard-e2e).images.conf

# Scenarios 1 (helm install, KubeProxy -> Ebpf), 2 (agent upgrade by helm upgrade),
# 3 (rollback with draining), 5 (an agent never Ready halts the transition) and 7
# (kubectl wait, printer columns), one cluster, about 2 minutes warm (cluster up ~26 s,
# scenarios ~93 s).
e2e-migration: setup
	bash e2e/scripts/migration.sh

TEST_SUITES += e2e-migration

# Issue 6's name for the operator's scenarios on the local cluster: the operator
# against the real API server (simulated agents) and the migration with real agents.
.PHONY: e2e-operator
e2e-operator: e2e-operator-smoke e2e-migration
