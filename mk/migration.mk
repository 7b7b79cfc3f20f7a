# The migration (issues 6 and 8): `make e2e-migration` runs the migration scenarios (helm
# install, Ebpf and back, long-lived connections) on a local 3-node cluster. `make demo`
# (mk/demo.mk) shows the same switch there and back under traffic.
.PHONY: e2e-migration

# Issue 6's seven scenarios, each with real agents and the helm-installed operator under
# continuous traffic (1 helm install and KubeProxy -> Ebpf, 2 agent upgrade by helm upgrade,
# 3 rollback with draining, 4 the operator SIGKILLed in ActivatingNodes and in
# DisablingKubeProxy, 4b kube-proxy not patchable, 5 an agent never Ready and the
# DataplaneConfig deleted, 6 kube-proxy owned by Argo CD, 7 kubectl wait and columns), one
# test each, in that order on one cluster (a failed one does not stop the rest), preceded by
# the operator's own cluster tests. About 4 minutes warm (cluster up ~20 s, operator tests
# ~40 s, scenarios ~170 s). SWITCHYARD_E2E_MIGRATION_TESTS=<filter> runs the matching
# scenarios (and the ones before them, which they start from).
.PHONY: e2e-operator
e2e-operator: setup
	bash e2e/scripts/migration.sh

# The former name of the same suite.
e2e-migration: e2e-operator

TEST_SUITES += e2e-operator
