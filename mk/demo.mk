# `make demo` (issues 6, 8 and 27): a local 3-node cluster switched from kube-proxy to eBPF
# and back (with draining) under traffic, a summary per direction; the cluster stays up
# (`make demo-down` removes it). `make demo-check` is the demo as `make test` runs it: on a
# state directory of its own, the summary written as JSON and checked, the cluster removed.
.PHONY: demo demo-down demo-check demo-summary-check-test

demo: setup
	bash e2e/scripts/demo.sh

demo-down:
	e2e/cluster down
	rm -f $(or $(SWITCHYARD_E2E_STATE),/var/lib/switchyard-e2e).images.conf

DEMO_CHECK_STATE ?= /var/lib/switchyard-e2e-demo-check
DEMO_SUMMARY ?= target/demo/summary.json

# The summary check's own tests: a summary per rule, about a second.
demo-summary-check-test: setup
	bash e2e/scripts/check-demo-summary-test.sh

# The check's tests first: a check that accepted everything would let the demo pass. Then
# the demo (about 25 s cluster up, 60 s there and back, 10 s down, warm) and its summary
# checked: zero failures both ways, enough answers in each, both directions really done
# (kube-proxy's rules gone then back on every node), the way back drained.
demo-check: demo-summary-check-test
	SWITCHYARD_E2E_STATE=$(DEMO_CHECK_STATE) SWITCHYARD_DEMO_DOWN=1 \
		SWITCHYARD_DEMO_SUMMARY=$(DEMO_SUMMARY) bash e2e/scripts/demo.sh
	bash e2e/scripts/check-demo-summary.sh $(DEMO_SUMMARY)

TEST_SUITES += demo-check
