# The migration (issues 6 and 8): `make demo` switches a local 3-node cluster from
# kube-proxy to eBPF under traffic and leaves it up; `make e2e-migration` runs the
# migration scenarios (helm install, Ebpf and back, long-lived connections) on one.
.PHONY: demo demo-down e2e-migration

demo: setup
	bash e2e/scripts/demo.sh

demo-down:
	e2e/cluster down

e2e-migration: setup
	bash e2e/scripts/migration.sh
