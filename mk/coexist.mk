# kube-proxy coexistence (node-agent/src/kube_proxy): cleanup of kube-proxy's rules,
# the nat keep-alive, the chain-order guard, the health endpoints. Privileged tests:
# each re-executes itself under `unshare` in private network, mount and PID
# namespaces (see node-agent/tests/kube_proxy_support), so the rules it loads into
# both iptables backends and nftables are its own; needs root. Serial, like the
# datapath tests, to keep the machine's two CPUs for the others (14 tests, about 28 s).
.PHONY: coexist-test

coexist-test: setup
	$(CARGO) test --locked -p switchyard-agent --test 'kube_proxy_*' -- \
		--ignored --test-threads=1 --nocapture

TEST_SUITES += coexist-test
