# The API (crds/) and the transition planner (operator/).
# `cargo test` already fails when crds/switchyard.dev_crds.yaml drifts from the Rust types;
# `make crds` regenerates it, and the Helm chart's copy with it.
.PHONY: crds crds-apiserver

crds:
	$(CARGO) run --quiet --locked -p switchyard-crds --bin crdgen > crds/switchyard.dev_crds.yaml.tmp
	mv crds/switchyard.dev_crds.yaml.tmp crds/switchyard.dev_crds.yaml
	if [ -d charts/switchyard/crds ]; then cp crds/switchyard.dev_crds.yaml charts/switchyard/crds/; fi

# The committed CRDs against a real Kubernetes 1.20.2 API server (etcd + kube-apiserver in a
# private network namespace, about 15 s): accepted as structural, defaults applied, enums,
# ranges and int-or-string enforced, status subresource, printer columns, kubectl explain.
crds-apiserver: setup e2e-build
	bash crds/tests/apiserver-1.20.sh

TEST_SUITES += crds-apiserver
