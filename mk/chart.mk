# The Helm chart: lint, rendering and schema checks (helm comes from the e2e build cache).
.PHONY: chart-test
chart-test:
	bash e2e/scripts/build-kubernetes.sh
	bash charts/test-chart.sh
	bash charts/test-chart-privileges.sh

TEST_SUITES += chart-test
