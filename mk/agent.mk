# The node agent: its pure core (node-agent/model, switchyard-model), the loader
# (node-agent/loader) and the agent itself (node-agent/src: core, standalone,
# cluster): the end-to-end standalone check and the programming benchmark.
.PHONY: standalone-test bench-programming

AGENT_TARGET_DIR := $(or $(CARGO_TARGET_DIR),target)

# Privileged: re-executes itself in private network, mount and PID namespaces.
standalone-test: setup
	$(CARGO) build --locked -p switchyard-agent --bin switchyard-agent
	bash node-agent/src/standalone/smoke_test.sh $(AGENT_TARGET_DIR)/debug/switchyard-agent

# Time to compute and apply 10,000 Services x 10 endpoints, a single-Service
# update with 10,000 present, and a restart, into fake and real BPF maps. Prints
# a table (needs root for the real maps; loads programs, attaches nothing).
bench-programming: setup
	$(CARGO) bench --locked -p switchyard-agent --bench programming

TEST_SUITES += standalone-test
