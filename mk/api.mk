# The API (crds/) and the transition planner (operator/).
# `cargo test` already fails when crds/switchyard.dev_crds.yaml drifts from the Rust types;
# `make crds` regenerates it.
.PHONY: crds

crds:
	$(CARGO) run --quiet --locked -p switchyard-crds --bin crdgen > crds/switchyard.dev_crds.yaml.tmp
	mv crds/switchyard.dev_crds.yaml.tmp crds/switchyard.dev_crds.yaml
