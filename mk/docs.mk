# docs/lessons.md maps each failure of Calico, Cilium and kube-proxy to the tests that
# reproduce it, and docs/parity.md each kube-proxy behaviour to the tests that prove
# Switchyard serves it; these checks fail when a test either page names is gone (and when
# parity.md calls a behaviour served without naming a test).
.PHONY: lessons-check parity-check

lessons-check:
	bash scripts/check-lessons.sh

parity-check:
	bash scripts/tests/check-parity-test.sh
	bash scripts/check-parity.sh

TEST_SUITES += lessons-check parity-check
