# Benchmarks (bench/, issue 7): Switchyard side by side with kube-proxy 1.20, and at
# scale. Benchmarks print tables and write target/bench/summary.json; they assert no
# speed. `make bench QUICK=1` (smallest sizes) is what `make test` runs, to check
# that the harness still works and writes a well-formed summary in which every
# Switchyard measurement was taken (bench/check-summary.sh).
.PHONY: bench bench-quick bench-summary-check-test

K8S_BIN ?= $(or $(SWITCHYARD_K8S_CACHE),$(HOME)/.cache/switchyard/k8s-1.20.2)/bin
BENCH_TARGET_DIR = $(or $(CARGO_TARGET_DIR),target)
# Full runs measure release builds; QUICK reuses the debug builds of `make test`.
BENCH_PROFILE = $(if $(QUICK),debug,release)
BENCH_CARGO_PROFILE = $(if $(QUICK),,--release)
BENCH_SUMMARY ?= target/bench/summary.json

bench: setup e2e-build
	$(CARGO) build --locked $(BENCH_CARGO_PROFILE) -p switchyard-agent -p switchyard-operator -p switchyard-bench
	mkdir -p target/bench
	set -o pipefail; $(BENCH_TARGET_DIR)/$(BENCH_PROFILE)/switchyard-bench run $(if $(QUICK),--quick) \
		--agent $(BENCH_TARGET_DIR)/$(BENCH_PROFILE)/switchyard-agent \
		--operator $(BENCH_TARGET_DIR)/$(BENCH_PROFILE)/switchyard-operator \
		--kubernetes-bin $(K8S_BIN) --output $(BENCH_SUMMARY) $(BENCH_ARGS) | tee target/bench/tables$(if $(QUICK),-quick).md
	bash bench/check-summary.sh $(BENCH_SUMMARY) $(BENCH_ARGS)

# The summary check's own tests: summaries made for each rule, a second each.
bench-summary-check-test: setup
	bash bench/tests/check-summary-test.sh

# The check's tests first: a check that accepted everything would let the run pass.
bench-quick: bench-summary-check-test
	$(MAKE) bench QUICK=1 BENCH_SUMMARY=target/bench/summary-quick.json

TEST_SUITES += bench-quick
