# Switchyard: `make demo` runs the main job, `make test` runs every test.
# Each part of the project adds its own targets and test suites in mk/*.mk.
SHELL := /bin/bash
export PATH := $(HOME)/.cargo/bin:$(PATH)
CARGO ?= cargo

# Suites that `make test` runs after lint and the unit tests, appended by mk/*.mk.
TEST_SUITES :=

.PHONY: setup lint unit-test test

# Installs everything the build and the tests need (idempotent).
setup:
	bash scripts/setup.sh

lint: setup
	$(CARGO) fmt --all --check
	$(CARGO) clippy --locked --all-targets -- -D warnings

unit-test: setup
	$(CARGO) test --locked

include $(sort $(wildcard mk/*.mk))

test: setup lint unit-test $(TEST_SUITES)
