# Shared steps of scripts/install, scripts/test and scripts/lint (sourced, not run).
# The caller sets PROG (its name, for messages) and runs from the repository root.
#
# Why a venv: Debian's own python3 refuses `pip install` outside one (PEP 668,
# "externally-managed-environment"), and a venv keeps the project's packages away from the
# system's. Everything runs from VENV; nothing is installed into the system Python.

VENV=.venv
VENV_STAMP="$VENV/.installed"

# Runs "$@" as root: directly when we are root, else through sudo.
as_root() {
  if [ "$(id -u)" = 0 ]; then
    "$@"
  elif command -v sudo >/dev/null 2>&1; then
    sudo "$@"
  else
    echo "$PROG: need root (or sudo) to run: $*" >&2
    return 1
  fi
}

# Installs Debian packages with apt-get (the package index is refreshed once per run).
apt_install() {
  [ $# -gt 0 ] || return 0
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "$PROG: no apt-get here; install these packages yourself: $*" >&2
    return 1
  fi
  echo "$PROG: installing $* with apt-get" >&2
  if [ -z "${_APT_UPDATED:-}" ]; then
    as_root apt-get update -qq
    _APT_UPDATED=1
  fi
  as_root env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# A python3 that can make venvs. Debian's python3 lacks ensurepip (so `python3 -m venv`
# fails) until the python3-venv package is installed.
ensure_python_venv() {
  if ! command -v python3 >/dev/null 2>&1; then
    apt_install python3 python3-venv
  elif ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
    apt_install python3-venv
  fi
  if ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
    echo "$PROG: $(command -v python3) cannot make a venv (no ensurepip/venv module)" >&2
    return 1
  fi
}

# Makes VENV when missing or broken, and installs this package into it (editable) with the
# extras "$1" (comma-separated, may be empty). The install is skipped when the same extras
# were installed from the same pyproject.toml by the same Python.
ensure_venv() {
  local extras="$1" spec="." key
  [ -z "$extras" ] || spec=".[$extras]"
  if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c '' >/dev/null 2>&1; then
    ensure_python_venv
    rm -rf "$VENV"
    echo "$PROG: making $VENV with $(command -v python3) ($(python3 --version 2>&1))" >&2
    python3 -m venv "$VENV"
  fi
  key="$(sha256sum pyproject.toml | cut -c1-16) $("$VENV/bin/python" -c \
    'import sys; print("%d.%d.%d" % sys.version_info[:3])') [$extras]"
  if [ -f "$VENV_STAMP" ] && grep -qxF "$key" "$VENV_STAMP"; then
    return 0
  fi
  echo "$PROG: installing $spec into $VENV with pip" >&2
  # --use-pep517: sdists without a pyproject.toml (etcd3) build the standard way, without
  # the legacy-install warning of older pips.
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --use-pep517 -e "$spec"
  echo "$key" >>"$VENV_STAMP"
}

# Puts the venv first on PATH, as `. .venv/bin/activate` does: `python`, `elastic-run` and
# `mpiexec` then resolve inside it, in this script and in every process it starts.
use_venv() {
  VIRTUAL_ENV="$(pwd)/$VENV"
  PATH="$VIRTUAL_ENV/bin:$PATH"
  export VIRTUAL_ENV PATH
  unset PYTHONHOME
}
