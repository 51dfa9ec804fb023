#!/usr/bin/env bash
# A real neutron-server on 127.0.0.1 for the OpenStack provider's tests:
# SQLite database, no Keystone (auth_strategy = noauth), no agents, the ML2
# core plugin with no mechanism drivers and the L3 router service plugin
# (extensions extraroute, extraroute-atomic, revision-if-match).
#
#   scripts/neutron.sh [start]   install if needed, start if not running, print the endpoint
#   scripts/neutron.sh stop      stop the server started by `start`
#   scripts/neutron.sh status    print the endpoint and exit 0 if the server answers, else exit 1
#   scripts/neutron.sh env       like start, then print CRC_NEUTRON_URL=... and CRC_NEUTRON_DB=...
#   scripts/neutron.sh install   only create the virtualenv
#
# `start` prints one line on stdout, the API endpoint (http://127.0.0.1:PORT);
# progress goes to stderr. It is idempotent: a running server is reused.
#
# Environment:
#   CRC_NEUTRON_DIR          run directory (config, SQLite file, log, pid);
#                            default ${TMPDIR:-/tmp}/cloud-route-controller-neutron
#   CRC_NEUTRON_PORT         port to listen on; default: a free port
#   CRC_NEUTRON_ROUTE_QUOTA  routes per router ([quotas] quota_router_route,
#                            which replaces the deprecated max_routes that
#                            Neutron 29 no longer reads); default 30, Neutron's default
#   CRC_NEUTRON_PYTHON       the Python 3 to build the virtualenv with; default python3.11 or python3
#   CRC_CACHE_DIR            cache root; default ~/.cache/cloud-route-controller
#
# The virtualenv lives in $CRC_CACHE_DIR/venv-neutron-<hash of
# tools/neutron/requirements.txt>, so changing a pin builds a new one and an
# unchanged file reuses it. Everything comes from PyPI.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
req="$repo/tools/neutron/requirements.txt"
serve_py="$repo/tools/neutron/serve.py"
cache=${CRC_CACHE_DIR:-$HOME/.cache/cloud-route-controller}
run=${CRC_NEUTRON_DIR:-${TMPDIR:-/tmp}/cloud-route-controller-neutron}
quota=${CRC_NEUTRON_ROUTE_QUOTA:-30}

log() { printf 'neutron.sh: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

pick_python() {
  if [[ -n ${CRC_NEUTRON_PYTHON:-} ]]; then echo "$CRC_NEUTRON_PYTHON"; return; fi
  for p in python3.11 python3; do
    if command -v "$p" >/dev/null 2>&1; then echo "$p"; return; fi
  done
  die "no python3 found (set CRC_NEUTRON_PYTHON)"
}

venv_dir() {
  local hash
  hash=$(sha256sum "$req" | cut -c1-16)
  echo "$cache/venv-neutron-$hash"
}

install() {
  local venv py t0
  venv=$(venv_dir)
  if [[ -f $venv/.complete ]]; then
    log "virtualenv ready: $venv"
    return
  fi
  py=$(pick_python)
  "$py" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' \
    || die "$py is older than 3.10; Neutron 29 needs 3.10 or newer"
  mkdir -p "$cache"
  # Several test binaries may start at once: one installs, the others wait.
  exec 8>"$cache/venv-neutron.lock"
  flock 8
  if [[ -f $venv/.complete ]]; then
    flock -u 8
    log "virtualenv ready: $venv"
    return
  fi
  t0=$(now)
  log "creating virtualenv $venv with $("$py" --version 2>&1) (about 130 packages from PyPI; a minute or more)"
  rm -rf "$venv"
  "$py" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip >&2
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$req" >&2
  touch "$venv/.complete"
  flock -u 8
  log "virtualenv installed in $(since "$t0") s"
}

pid_alive() {
  [[ -f $run/server.pid ]] && kill -0 "$(cat "$run/server.pid")" 2>/dev/null
}

answers() {
  # The version document at / answers 200 once the API is up.
  local url=$1
  "$(venv_dir)/bin/python" - "$url" <<'EOF' 2>/dev/null
import sys, urllib.request
try:
    with urllib.request.urlopen(sys.argv[1] + "/", timeout=2) as r:
        sys.exit(0 if r.status == 200 else 1)
except Exception:
    sys.exit(1)
EOF
}

status() {
  if pid_alive && [[ -f $run/endpoint ]] && answers "$(cat "$run/endpoint")"; then
    cat "$run/endpoint"
    return 0
  fi
  return 1
}

free_port() {
  "$(venv_dir)/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

write_conf() {
  local venv=$1
  cat >"$run/neutron.conf" <<EOF
# Written by scripts/neutron.sh: a test neutron-server, no Keystone, no agents.
[DEFAULT]
core_plugin = ml2
service_plugins = router
auth_strategy = noauth
transport_url = fake:/
api_paste_config = $venv/etc/neutron/api-paste.ini
state_path = $run/state
use_stderr = true
debug = false

[database]
# Concurrent tests write at once; SQLite's default 5 s lock wait ran out on
# a loaded machine ("database is locked", HTTP 500 to POST /subnets).
connection = sqlite:///$run/neutron.sqlite?timeout=60

[ml2]
# No mechanism driver: ports are only database rows, nothing is wired.
mechanism_drivers =
type_drivers = local,flat
tenant_network_types = local
extension_drivers = port_security

[quotas]
# Routes per router (replaces the deprecated DEFAULT/max_routes).
quota_router_route = $quota

[oslo_concurrency]
lock_path = $run/state/lock
EOF
}

start() {
  local venv port url t0 pid
  install
  venv=$(venv_dir)
  mkdir -p "$run"
  exec 9>"$run/start.lock"
  flock 9
  if url=$(status); then
    log "already running (pid $(cat "$run/server.pid"))"
    echo "$url"
    return
  fi
  if pid_alive; then
    log "pid $(cat "$run/server.pid") does not answer; stopping it"
    stop_server
  fi
  t0=$(now)
  port=${CRC_NEUTRON_PORT:-$(free_port)}
  url="http://127.0.0.1:$port"
  rm -rf "$run/state" "$run/neutron.sqlite" "$run/endpoint"
  mkdir -p "$run/state/lock"
  write_conf "$venv"
  # An empty schema is the same for every start with one virtualenv: build
  # it once (about 10 s) and copy it afterwards.
  if [[ ! -f $venv/empty-schema.sqlite ]]; then
    log "creating the empty schema $venv/empty-schema.sqlite"
    rm -f "$venv/empty-schema.sqlite.tmp"
    "$venv/bin/python" "$serve_py" initdb "sqlite:///$venv/empty-schema.sqlite.tmp" >>"$run/server.log" 2>&1 \
      || { tail -n 20 "$run/server.log" >&2; die "creating the database failed (log: $run/server.log)"; }
    mv "$venv/empty-schema.sqlite.tmp" "$venv/empty-schema.sqlite"
  fi
  cp "$venv/empty-schema.sqlite" "$run/neutron.sqlite"
  log "starting neutron-server on $url (log: $run/server.log)"
  # setsid: the server outlives this script and the test process that ran it.
  OS_NEUTRON_CONFIG_DIR="$run" OS_NEUTRON_CONFIG_FILES="$run/neutron.conf" \
    setsid "$venv/bin/python" "$serve_py" serve 127.0.0.1 "$port" \
    >>"$run/server.log" 2>&1 </dev/null 8>&- 9>&- &
  pid=$!
  echo "$pid" >"$run/server.pid"
  for _ in $(seq 1 240); do
    if answers "$url"; then
      echo "$url" >"$run/endpoint"
      log "neutron-server (pid $pid) answers after $(since "$t0") s"
      echo "$url"
      return
    fi
    kill -0 "$pid" 2>/dev/null || { tail -n 30 "$run/server.log" >&2; die "neutron-server exited (log: $run/server.log)"; }
    sleep 0.25
  done
  tail -n 30 "$run/server.log" >&2
  stop_server
  die "neutron-server did not answer within 60 s"
}

stop_server() {
  local pid
  [[ -f $run/server.pid ]] || return 0
  pid=$(cat "$run/server.pid")
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid" 2>/dev/null || true
    log "stopped neutron-server (pid $pid)"
  fi
  rm -f "$run/server.pid" "$run/endpoint"
}

case ${1:-start} in
  start) start ;;
  env)
    url=$(start)
    echo "CRC_NEUTRON_URL=$url"
    echo "CRC_NEUTRON_DB=$run/neutron.sqlite"
    ;;
  stop) stop_server ;;
  status) status || { log "not running"; exit 1; } ;;
  install) install ;;
  *) die "unknown command ${1}; use start, stop, status, env or install" ;;
esac
