# End-to-end tests on a real local Kubernetes 1.20 cluster (see e2e/README.md).
.PHONY: e2e-build e2e-smoke e2e-up e2e-down

# Builds (or finds cached) kube-apiserver, kube-controller-manager, kube-scheduler,
# kubemark, kube-proxy, etcd, helm and kubectl under ~/.cache/switchyard/k8s-1.20.2.
e2e-build: setup
	bash e2e/scripts/build-kubernetes.sh

# Three hollow nodes with real kube-proxy; ClusterIP and NodePort traffic; a
# kube-proxy pod replaced; torn down and checked clean.
e2e-smoke: setup
	bash e2e/scripts/smoke.sh

e2e-up: setup
	$(CARGO) build --locked -p switchyard-e2e --bin switchyard-e2e-pod-runner
	e2e/cluster up --nodes $(or $(NODES),3)

e2e-down:
	e2e/cluster down

TEST_SUITES += e2e-smoke
