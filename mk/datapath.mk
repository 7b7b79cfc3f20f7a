# The eBPF datapath (ebpf/, node-agent/loader): privileged netns tests and the
# benchmark. Each test re-executes itself under `unshare` in private network,
# mount and PID namespaces (see node-agent/tests/datapath_support), needs root,
# and runs serially: they share the machine's two CPUs with nothing else of ours.
.PHONY: datapath-test bench-datapath ebpf-lint

# The kernel programs are not a default workspace member (they build only for the
# BPF target); lint them with the nightly toolchain they are built with.
ebpf-lint: setup
	cargo +nightly clippy --locked -p switchyard-ebpf --target bpfel-unknown-none \
		-Z build-std=core --release -- -D warnings

datapath-test: setup
	$(CARGO) test --locked -p switchyard-agent --test 'datapath_*' -- \
		--ignored --test-threads=1 --skip benchmark

# Issue 3's benchmark: programming time, and connect rate/latency through the TC
# programs versus kube-proxy-style iptables rules versus the pod IP; issue 7's
# latency flatness (100 and 30,000 Services on one node, interleaved, with the
# programs' own run time); the conntrack sweep. Prints tables.
bench-datapath: setup
	$(CARGO) test --locked --release -p switchyard-agent --test datapath_bench -- \
		--ignored --nocapture --test-threads=1 benchmark

TEST_SUITES += ebpf-lint datapath-test
