#!/usr/bin/env bash
# Runs moto's EC2 emulator for the AWS provider's tests.
#
#   scripts/moto.sh [start] [--name NAME] [--owner-pid PID]
#       Installs moto into a cached virtualenv if needed, starts moto_server on
#       127.0.0.1 and a free port (or finds the one already running under NAME),
#       waits until it answers and prints its endpoint URL as the only line on
#       stdout. With --owner-pid the server stops by itself once process PID
#       exits (test binaries pass their own pid), and NAME defaults to
#       owner-PID so concurrent test binaries each get their own server.
#   scripts/moto.sh stop [--name NAME]     stops the server started under NAME
#   scripts/moto.sh status [--name NAME]   prints the endpoint if it is running
#   scripts/moto.sh venv                   installs only, prints the venv path
#
# Progress goes to stderr. Environment: CRC_CACHE_DIR (default
# ~/.cache/cloud-route-controller), PYTHON (default python3).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
requirements="$here/tools/moto/requirements.txt"
cache="${CRC_CACHE_DIR:-$HOME/.cache/cloud-route-controller}"
python="${PYTHON:-python3}"

log() { echo "moto.sh: $*" >&2; }
die() { log "error: $*"; exit 1; }

cmd="start"
case "${1:-}" in
  start|stop|status|venv) cmd="$1"; shift ;;
esac
name=""
owner_pid=""
while [ $# -gt 0 ]; do
  case "$1" in
    --name) name="${2:?--name needs a value}"; shift 2 ;;
    --owner-pid) owner_pid="${2:?--owner-pid needs a value}"; shift 2 ;;
    *) die "unknown argument '$1' (see the header of $0)" ;;
  esac
done
if [ -n "$owner_pid" ]; then
  case "$owner_pid" in *[!0-9]*) die "--owner-pid must be a process id" ;; esac
  kill -0 "$owner_pid" 2>/dev/null || die "owner process $owner_pid is not running"
fi
name="${name:-${owner_pid:+owner-$owner_pid}}"
name="${name:-default}"
case "$name" in *[!A-Za-z0-9_.-]*) die "--name may only use letters, digits, '.', '_' and '-'" ;; esac
state="$cache/moto/$name"

# The venv is keyed by the requirements and the interpreter, so a changed pin
# or a different Python gets a fresh one and an unchanged setup costs nothing.
ensure_venv() {
  command -v "$python" >/dev/null || die "$python not found; install Python 3 (3.9 or newer)"
  local key venv
  key="$({ cat "$requirements"; "$python" -c 'import sys; print(sys.version)'; } | sha256sum | cut -c1-16)"
  venv="$cache/venv-moto-$key"
  if [ -x "$venv/bin/moto_server" ] && [ -f "$venv/.complete" ]; then
    echo "$venv"
    return
  fi
  mkdir -p "$cache"
  # Several test binaries may start at once; one installs, the others wait.
  exec 9>"$cache/venv-moto-$key.lock"
  flock 9
  if [ ! -f "$venv/.complete" ]; then
    log "creating virtualenv $venv (first run only; takes about a minute)"
    rm -rf "$venv"
    "$python" -m venv "$venv" >&2
    "$venv/bin/pip" install --quiet --disable-pip-version-check --no-input -r "$requirements" >&2 \
      || { rm -rf "$venv"; die "pip install failed"; }
    touch "$venv/.complete"
    log "installed $("$venv/bin/python" -c 'import moto; print("moto", moto.__version__)')"
  fi
  exec 9>&-
  echo "$venv"
}

# Answers when moto's own API responds; used for readiness and liveness.
answers() {
  "$python" - "$1" <<'EOF' 2>/dev/null
import sys, urllib.request
try:
    with urllib.request.urlopen(sys.argv[1] + "/moto-api/data.json", timeout=2) as r:
        sys.exit(0 if r.status == 200 else 1)
except Exception:
    sys.exit(1)
EOF
}

running_endpoint() {
  [ -f "$state/pid" ] && [ -f "$state/endpoint" ] || return 1
  local pid endpoint
  pid="$(cat "$state/pid")"
  endpoint="$(cat "$state/endpoint")"
  kill -0 "$pid" 2>/dev/null || return 1
  answers "$endpoint" || return 1
  echo "$endpoint"
}

stop_server() {
  local pid
  for f in watchdog pid; do
    if [ -f "$state/$f" ]; then
      pid="$(cat "$state/$f")"
      if kill -0 "$pid" 2>/dev/null; then
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$pid" 2>/dev/null || true
      fi
      rm -f "$state/$f"
    fi
  done
  rm -f "$state/endpoint"
}

case "$cmd" in
  venv)
    ensure_venv
    exit 0
    ;;
  status)
    running_endpoint || { log "no moto server running under '$name'"; exit 1; }
    exit 0
    ;;
  stop)
    stop_server
    log "stopped '$name'"
    exit 0
    ;;
esac

if endpoint="$(running_endpoint)"; then
  log "moto server '$name' already running at $endpoint"
  echo "$endpoint"
  exit 0
fi

venv="$(ensure_venv)"
mkdir -p "$state"
stop_server
port="$("$python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
endpoint="http://127.0.0.1:$port"
log "starting moto_server '$name' on $endpoint (log: $state/server.log)"
# setsid: the server must outlive this script and not share its terminal.
setsid "$venv/bin/moto_server" -H 127.0.0.1 -p "$port" >"$state/server.log" 2>&1 </dev/null &
server_pid=$!
echo "$server_pid" >"$state/pid"
echo "$endpoint" >"$state/endpoint"

if [ -n "$owner_pid" ]; then
  # A watchdog ends the server when the owner (a test binary) exits, so test
  # runs leave nothing behind even when they crash.
  setsid bash -c '
    while kill -0 "$1" 2>/dev/null && kill -0 "$2" 2>/dev/null; do sleep 1; done
    kill "$2" 2>/dev/null; rm -rf "$3"' moto-watchdog "$owner_pid" "$server_pid" "$state" \
    >/dev/null 2>&1 </dev/null &
  echo "$!" >"$state/watchdog"
fi

for _ in $(seq 1 150); do
  if answers "$endpoint"; then
    log "moto server '$name' is up"
    echo "$endpoint"
    exit 0
  fi
  kill -0 "$server_pid" 2>/dev/null || { tail -20 "$state/server.log" >&2; die "moto_server exited"; }
  sleep 0.2
done
tail -20 "$state/server.log" >&2
stop_server
die "moto_server did not answer within 30 s"
