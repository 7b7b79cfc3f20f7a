# No container engine or registry here: check what can be checked of images/*.Dockerfile
# against the binaries this workspace builds (see scripts/check-images.sh).
.PHONY: images-check
images-check: setup
	$(CARGO) build --locked -p switchyard-operator -p switchyard-agent
	bash scripts/check-images.sh $(or $(CARGO_TARGET_DIR),target)/debug/switchyard-operator $(or $(CARGO_TARGET_DIR),target)/debug/switchyard-agent

TEST_SUITES += images-check
