#!/usr/bin/env bash
# The EC2 scenarios of the real-API-server benchmark (`make bench-aws`):
# upstream's route controller with the real k8s.io/cloud-provider-aws
# (watch gate off and on) and this project's three modes, each run on a
# fresh kube-apiserver and a fresh moto behind the counting proxy, in three
# scenarios:
#   plain    moto as it is (no limits)
#   buckets  EC2's documented per-action token buckets enforced
#   storm    the buckets plus a 30 s throttle storm once half the burst exists
# Arguments go to every real-api-bench invocation (e.g. --nodes 200).
# Results: $BENCH_OUT/<scenario>/results.{md,json}.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
out=${BENCH_OUT:-$HOME/.cache/cloud-route-controller/bench/aws-$(date +%Y%m%d-%H%M%S)}
scenarios=${BENCH_AWS_SCENARIOS:-plain buckets storm}

for s in $scenarios; do
  case "$s" in
    plain) extra=() ;;
    buckets) extra=(--ec2-buckets) ;;
    storm) extra=(--ec2-buckets --storm-s 30) ;;
    *) echo "unknown scenario $s (plain, buckets, storm)" >&2; exit 2 ;;
  esac
  BENCH_OUT="$out/$s" "$root/scripts/bench.sh" --cloud aws "${extra[@]}" "$@"
done
echo "results under $out" >&2
