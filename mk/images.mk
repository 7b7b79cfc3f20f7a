# Container images of the agent and the operator, built with Debian's tools and
# packages only (no container engine or registry here): see docs/images.md.
.PHONY: images images-test images-check

# target/images/switchyard-agent.oci.tar and target/images/switchyard-operator.oci.tar,
# around the release binaries.
images: setup
	bash images/build.sh

# Builds the images twice and checks that both builds are byte-identical, what the
# images hold and that their programs run (images/test.sh). Needs the release build.
images-test: setup
	bash images/test.sh

# The same checks but the reproducibility one, on images assembled once around the
# debug binaries (no release build), written to target/images/check.
images-check: setup
	$(CARGO) build --locked -p switchyard-operator -p switchyard-agent
	bash images/test.sh --once --binaries $(or $(CARGO_TARGET_DIR),target)/debug

TEST_SUITES += images-check

# The e2e suites (e2e-agent, e2e-operator, demo) run Switchyard's pods from archives of
# their own, around the debug binaries they build (e2e/scripts/images.sh): built once per
# content under target/images/e2e/KEY, so the suites of one `make test` share one build.
