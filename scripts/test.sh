#!/usr/bin/env bash
# The project's test command (`make test`, `.ci/run`): builds what the tests
# need (the control plane once per machine, the Rust workspace), starts one
# local control plane for all integration tests, and runs lint, unit,
# property, integration and end-to-end tests. The Go builds (kube-apiserver,
# etcd and kubectl; helm, promtool and the Azure wire check, each once per
# machine) and the install of cargo-deny (once per machine) run in the
# background while cargo builds, since cargo alone leaves a core idle much
# of the time; their progress lines are prefixed [controlplane ...],
# [helm ...], [cargo-deny] and so on. Clippy runs as the compiler of
# the workspace's own crates inside the one build (as `cargo clippy` itself
# does, with `RUSTC_WORKSPACE_WRAPPER`), so the dependencies are compiled
# once instead of once for lints and again for tests. Servers and builds it
# starts are stopped on exit, whatever happens.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/cloud-route-controller/target}
export CARGO_TERM_COLOR=${CARGO_TERM_COLOR:-never}
# A one-off build gains nothing from incremental compilation's bookkeeping.
export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}
export GOTOOLCHAIN=local CGO_ENABLED=0
start=$SECONDS
step() { printf '\n==> [%ss] %s\n' "$((SECONDS - start))" "$*"; }

bg_pids=()
cleanup() {
  for pid in "${bg_pids[@]}"; do
    kill -- "-$pid" 2>/dev/null || kill "$pid" 2>/dev/null || true
  done
  if [[ -n "${CRC_STATE_DIR:-}" ]]; then
    scripts/controlplane.sh down >/dev/null 2>&1 || true
    rm -rf "$CRC_STATE_DIR"
  fi
  scripts/neutron.sh stop >/dev/null 2>&1 || true
  scripts/moto.sh stop >/dev/null 2>&1 || true
}
trap cleanup EXIT

step "control-plane binaries (kube-apiserver, etcd, kubectl; built once per machine, in the background)"
cp_out=$(mktemp)
set -m
# Niced: cargo's build is the longest path; Go takes the cycles it leaves.
( nice -n 10 scripts/build-controlplane.sh >"$cp_out" ) &
cp_pid=$!
set +m
bg_pids+=("$cp_pid")

step "tools for the tests: podman, helm, promtool and azure-wire-check (the Go tools built once per machine, in the background)"
# podman builds and unpacks the container image (tests/container_image.rs).
if ! command -v podman >/dev/null; then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
    t=$SECONDS
    echo "installing podman with apt-get ..."
    apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q podman >/dev/null
    echo "podman installed in $((SECONDS - t))s"
  else
    reason="podman is not installed and this is not a root shell with apt-get"
    printf '\n!!!!!!!! %s: the container image test will be SKIPPED !!!!!!!!\n\n' "$reason" >&2
    export CRC_SKIP_IMAGE_TEST=$reason
  fi
fi
set -m
( nice -n 10 scripts/build-gotool.sh helm >/dev/null && nice -n 10 scripts/build-gotool.sh promtool >/dev/null \
  && nice -n 10 scripts/build-gotool.sh azure-wire-check >/dev/null ) &
tools_pid=$!
set +m
bg_pids+=("$tools_pid")
# parliament (the AWS policy's linter) into its cached virtualenv; the test
# that runs it waits on the same lock if this has not finished.
set -m
( nice -n 10 scripts/iam-lint.sh venv >/dev/null ) &
bg_pids+=("$!")
set +m
# cargo-deny checks deny.toml (licences, bans, sources) after the tests;
# installed from crates.io once per machine (4 minutes of CPU), at the
# lowest priority, so the control-plane build, which the tests wait for,
# keeps the cores, and the install finishes in the tests' idle time; its
# compile lines are prefixed [cargo-deny].
deny_out=$(mktemp)
set -m
( nice -n 19 scripts/build-cargo-tool.sh cargo-deny >"$deny_out" ) &
deny_pid=$!
set +m
bg_pids+=("$deny_pid")

step "formatting"
cargo fmt --all -- --check

step "build with lints (clippy on the workspace's crates, warnings denied)"
clippy_driver=$(rustup which clippy-driver 2>/dev/null || command -v clippy-driver || true)
if [[ -z "$clippy_driver" ]]; then
  echo "clippy-driver not found: install the clippy component (rustup component add clippy)" >&2
  exit 1
fi
# What `cargo clippy -- -D warnings` sets, kept for `cargo test` below so
# that it reuses this build instead of compiling the workspace again.
export RUSTC_WORKSPACE_WRAPPER=$clippy_driver
export CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"
# The lab build of the binary (the simulated cloud, simulate and check), which
# the integration tests run; every cargo call below names the same features
# so that it reuses this build. tests/supply_chain.rs checks that the release
# build (no lab) links none of it.
lab=(--features cloud-route-controller/lab)
cargo build --workspace --all-targets --locked "${lab[@]}"

step "waiting for the control-plane binaries, helm, promtool and azure-wire-check"
if ! wait "$cp_pid"; then
  echo "FAILED: building the control plane (see the [controlplane] lines above)" >&2
  exit 1
fi
CRC_CONTROLPLANE_BIN_DIR=$(tail -n 1 "$cp_out")
export CRC_CONTROLPLANE_BIN_DIR
rm -f "$cp_out"
if ! wait "$tools_pid"; then
  echo "FAILED: building helm, promtool or azure-wire-check (see the [helm]/[promtool]/[azure-wire-check] lines above)" >&2
  exit 1
fi
bg_pids=("$deny_pid")

step "local control plane for the integration tests"
# A private state directory, so a developer's own `make controlplane` is left alone.
CRC_STATE_DIR=$(mktemp -d)
export CRC_STATE_DIR
eval "$(scripts/controlplane.sh up | grep '^export ')"

step "the upstream route controller, its Go tests and the switch-over test, started in the background"
# The Go baseline (tools/upstream-route-controller): its build.sh builds the
# binary once per machine, and tests/switch_over.rs runs it before this
# project's controller takes over its routes; its unit tests compile the
# same packages with the same -trimpath, so they reuse that build. On a
# fresh machine the compile takes minutes (client-go, the AWS SDK for Go).
# Neither the build nor these tests hold anything the other Rust tests use,
# so they run beside them (niced) rather than beside the workspace build,
# whose Go builds already outlast it; build progress lines are prefixed
# [upstream-baseline], and the tests' output follows the Rust tests'.
switch_bin=$(cargo test --workspace --locked "${lab[@]}" --test switch_over --no-run --message-format=json \
  | python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("executable") and m["target"]["name"] == "switch_over":
        print(m["executable"])')
go_log=$(mktemp)
switch_log=$(mktemp)
set -m
(
  cd tools/upstream-route-controller
  bin=$(nice -n 10 ./build.sh | tail -n 1) || exit 1
  nice -n 10 go test -trimpath ./... >"$go_log" 2>&1 &
  go_test=$!
  status=0
  ( cd ../../crates/cloud-route-controller \
    && CRC_UPSTREAM_ROUTE_CONTROLLER=$bin exec "$switch_bin" --nocapture ) >"$switch_log" 2>&1 || status=1
  wait "$go_test" || status=1
  exit "$status"
) &
go_pid=$!
set +m
bg_pids+=("$go_pid")
echo "started the upstream route controller's build, then go test ./... and the switch-over test (pid $go_pid)"

step "Rust tests (unit, property, virtual-time, integration, end-to-end)"
# The longest tests run for 5 minutes each on control planes of their own
# (they hold nothing the others share): the wait-out of a refusal's backoff,
# and two clusters sharing one route table. They run beside the rest instead
# of after them, and their output follows theirs.
slow_tests=(
  "e2e_aws_interrupted a_terminated_instance_whose_replacement_ec2_refuses_costs_at_most_3_replace_routes_in_5_minutes_in_every_mode"
  "e2e_aws_tables two_clusters_with_overlapping_cidrs_share_one_table_for_5_minutes_without_deleting_each_others_routes"
)
slow_pids=()
slow_logs=()
skips=()
for entry in "${slow_tests[@]}"; do
  read -r slow_target slow_test <<<"$entry"
  slow_bin=$(cargo test --workspace --locked "${lab[@]}" --test "$slow_target" --no-run --message-format=json \
    | SLOW_TARGET="$slow_target" python3 -c 'import json, os, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("executable") and m["target"]["name"] == os.environ["SLOW_TARGET"]:
        print(m["executable"])')
  slow_log=$(mktemp)
  ( cd crates/cloud-route-controller && exec "$slow_bin" --exact "$slow_test" --nocapture ) >"$slow_log" 2>&1 &
  slow_pids+=("$!")
  slow_logs+=("$slow_log")
  bg_pids+=("$!")
  skips+=(--skip "$slow_test")
  echo "started $slow_test in the background (pid $!)"
done
# Whole test files that take minutes and share nothing with the others but
# the cluster run beside the rest on a control plane of their own (their
# TestCluster starts one when CRC_TEST_KUBECONFIG is unset): faults.rs takes
# about 4 minutes, all of it waiting on the shared cluster's lock otherwise;
# e2e_aws_drift.rs about 3 (it waits out drift periods); e2e_aws_outage.rs
# about 2 (a 40 s outage and a 20 s refusal, each waited out);
# leader_at_scale.rs about 2 (1,000 Nodes' conditions at 20 QPS, twice).
# e2e_aws_safety.rs stays on the shared cluster: it holds the cluster's lock
# for about 25 s (two tests, each two controller runs of two passes).
own_plane_targets=(faults e2e_aws_drift e2e_aws_outage leader_at_scale)
for target in "${own_plane_targets[@]}"; do
  target_bin=$(cargo test --workspace --locked "${lab[@]}" --test "$target" --no-run --message-format=json \
    | TARGET="$target" python3 -c 'import json, os, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("executable") and m["target"]["name"] == os.environ["TARGET"]:
        print(m["executable"])')
  target_log=$(mktemp)
  ( cd crates/cloud-route-controller \
    && exec env -u CRC_TEST_KUBECONFIG -u CRC_TEST_ETCD_URL "$target_bin" ) >"$target_log" 2>&1 &
  slow_pids+=("$!")
  slow_logs+=("$target_log")
  slow_tests+=("$target all of tests/$target.rs")
  bg_pids+=("$!")
  while IFS= read -r name; do
    skips+=(--skip "$name")
  done < <("$target_bin" --list --format terse | sed -n 's/: test$//p')
  echo "started tests/$target.rs on a control plane of its own in the background (pid $!)"
done
# Run by the upstream job above, once its binary is built.
skips+=(--skip aws_routes_upstream_made_are_taken_over --skip hcloud_routes_upstream_made_are_taken_over)
rust_status=0
cargo test --workspace --locked "${lab[@]}" --no-fail-fast -- "${skips[@]}" || rust_status=$?

slow_status=0
for i in "${!slow_pids[@]}"; do
  step "waiting for ${slow_tests[$i]#* } (started beside the others)"
  if ! wait "${slow_pids[$i]}"; then
    slow_status=1
  fi
  cat "${slow_logs[$i]}"
  rm -f "${slow_logs[$i]}"
done

step "licences, bans and sources of the dependencies (cargo-deny, deny.toml; advisories need GitHub and are not checked here)"
deny_status=0
if wait "$deny_pid"; then
  "$(tail -n 1 "$deny_out")" --locked check licenses bans sources || deny_status=$?
else
  echo "FAILED: installing cargo-deny (see the [cargo-deny] lines above)" >&2
  deny_status=1
fi
rm -f "$deny_out"

step "waiting for the upstream route controller's Go tests and the switch-over test (started beside the Rust tests)"
if wait "$go_pid"; then
  go_status=0
else
  go_status=$?
fi
bg_pids=()
cat "$go_log" "$switch_log"
rm -f "$go_log" "$switch_log"
if [[ $slow_status -ne 0 || $rust_status -ne 0 || $go_status -ne 0 || $deny_status -ne 0 ]]; then
  echo "FAILED: tests (cargo test exit $rust_status, background tests $slow_status, upstream build, go test or switch-over exit $go_status, cargo-deny exit $deny_status)" >&2
  exit 1
fi

step "all tests passed in $((SECONDS - start))s"
