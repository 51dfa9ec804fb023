# cloud-route-controller — entry points for people and CI.
SHELL := /bin/bash
export CARGO_TARGET_DIR ?= $(HOME)/.cache/cloud-route-controller/target

.PHONY: test demo controlplane controlplane-down build fmt lint

# The one test command (README, .ci/run).
test:
	scripts/test.sh

demo:
	scripts/demo.sh

build:
	cargo build --release -p cloud-route-controller

controlplane:
	scripts/controlplane.sh up

controlplane-down:
	scripts/controlplane.sh down

fmt:
	cargo fmt --all

lint:
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings
