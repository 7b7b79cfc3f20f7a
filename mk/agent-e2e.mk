# The node agent in a real cluster (issue 5): restarts, Service changes, Node
# churn, an unreachable API server at start, kube-proxy started after the agent
# and its cleanup, each under continuous traffic. One 3-node cluster, a few
# minutes. SWITCHYARD_E2E_AGENT_TESTS=<filter> runs a subset.
.PHONY: e2e-agent

e2e-agent: setup
	bash e2e/scripts/agent.sh

TEST_SUITES += e2e-agent
