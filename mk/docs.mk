# docs/lessons.md maps each failure of Calico, Cilium and kube-proxy to the tests that
# reproduce it; this check fails when a test it names is gone.
.PHONY: lessons-check
lessons-check:
	bash scripts/check-lessons.sh

TEST_SUITES += lessons-check
