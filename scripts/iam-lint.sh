#!/usr/bin/env bash
# Lints the AWS IAM policy in deploy/iam/ with parliament (duo-labs' IAM
# policy linter, from PyPI) for crates/provider-aws/tests/permissions.rs.
#
#   scripts/iam-lint.sh [lint] [FILE...]   install if needed, lint FILEs (default
#                                          deploy/iam/aws-policy.json); prints one
#                                          JSON line per finding, exits 1 if any
#   scripts/iam-lint.sh venv               install only, print the venv path
#
# Progress goes to stderr. Environment: CRC_CACHE_DIR (default
# ~/.cache/cloud-route-controller), PYTHON (default python3).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
requirements="$here/tools/parliament/requirements.txt"
lint_py="$here/tools/parliament/lint.py"
cache="${CRC_CACHE_DIR:-$HOME/.cache/cloud-route-controller}"
python="${PYTHON:-python3}"

log() { echo "iam-lint.sh: $*" >&2; }
die() { log "error: $*"; exit 2; }

cmd="lint"
case "${1:-}" in
  lint|venv) cmd="$1"; shift ;;
esac

# Keyed by the requirements and the interpreter, as scripts/moto.sh's venv.
ensure_venv() {
  command -v "$python" >/dev/null || die "$python not found; install Python 3 (3.9 or newer)"
  local key venv
  key="$({ cat "$requirements"; "$python" -c 'import sys; print(sys.version)'; } | sha256sum | cut -c1-16)"
  venv="$cache/venv-parliament-$key"
  if [ -x "$venv/bin/python" ] && [ -f "$venv/.complete" ]; then
    echo "$venv"
    return
  fi
  mkdir -p "$cache"
  # make test installs it in the background while a test may already ask.
  exec 9>"$cache/venv-parliament-$key.lock"
  flock 9
  if [ ! -f "$venv/.complete" ]; then
    log "creating virtualenv $venv (first run only; about 20 s)"
    rm -rf "$venv"
    "$python" -m venv "$venv" >&2
    "$venv/bin/pip" install --quiet --disable-pip-version-check --no-input -r "$requirements" >&2 \
      || { rm -rf "$venv"; die "pip install failed"; }
    touch "$venv/.complete"
    log "installed parliament $("$venv/bin/python" -c 'import parliament; print(parliament.__version__)')"
  fi
  exec 9>&-
  echo "$venv"
}

venv="$(ensure_venv)"
case "$cmd" in
  venv) echo "$venv" ;;
  lint)
    [ $# -gt 0 ] || set -- "$here/deploy/iam/aws-policy.json"
    exec "$venv/bin/python" "$lint_py" "$@"
    ;;
esac
