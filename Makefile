# cloud-route-controller — entry points for people and CI.
SHELL := /bin/bash
export CARGO_TARGET_DIR ?= $(HOME)/.cache/cloud-route-controller/target

.PHONY: test demo image bench bench-aws simulate fuzz controlplane controlplane-down build fmt lint reference compat

# The one test command (README, .ci/run).
test:
	scripts/test.sh

demo:
	scripts/demo.sh

# The container image, offline: the release binary, its shared libraries and
# the CA bundle FROM scratch with podman (vfs), and its CycloneDX SBOM beside
# it ($CARGO_TARGET_DIR/image/), inside it and in its labels. Extra arguments:
# make image ARGS="--tag registry.example.com/cloud-route-controller:v0.1.0"
image:
	scripts/image.sh $(ARGS)

# Side by side with the upstream Go controller on a real API server (long; not in `make test`).
# Extra arguments: make bench ARGS="--nodes 5000"
bench:
	scripts/bench.sh $(ARGS)

# The EC2 scenarios: upstream with the real k8s.io/cloud-provider-aws and our
# modes against moto behind the counting proxy, without limits, with EC2's
# token buckets, and with a throttle storm. Example from BENCHMARKS.md:
# make bench-aws ARGS="--nodes 1000 --converge-timeout-s 300 --settle-s 40"
bench-aws:
	scripts/bench-aws.sh $(ARGS)

# The three modes on a virtual clock (no cloud provider crates needed).
simulate:
	cargo run --release -p cloud-route-controller --no-default-features --features lab -- simulate crates/simulator/scenarios/autoscaling-5000.toml

# Real coverage-guided fuzzing (needs a nightly toolchain); `make test` replays the targets on stable.
fuzz:
	cd fuzz && for t in memory_config hcloud_config openstack_config ccm_configs cidrs sim_answers; do \
		cargo +nightly fuzz run -s none $$t corpus/$$t seeds/$$t -- -max_total_time=600 || exit 1; done

build:
	cargo build --release -p cloud-route-controller

controlplane:
	scripts/controlplane.sh up

controlplane-down:
	scripts/controlplane.sh down

# The generated reference pages (docs/reference/: the command line, the
# metrics, the conditions and Events) and the chart README's values table,
# written from the code; make test fails while a committed page differs.
reference:
	CRC_WRITE_REFERENCE=1 cargo test -p cloud-route-controller --features lab --test reference
	scripts/chart-readme.py

# The compatibility matrix: the end-to-end route tests on the oldest, a middle
# and the newest Kubernetes minor of docs/compatibility.md, each on its own
# kube-apiserver built from Go modules; writes the result into that page.
compat:
	scripts/compat-matrix.sh --write $(ARGS)

fmt:
	cargo fmt --all

lint:
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets --features cloud-route-controller/lab -- -D warnings
	cargo clippy -p cloud-route-controller -- -D warnings
