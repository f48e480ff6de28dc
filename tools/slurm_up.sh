#!/usr/bin/env bash
# Start a single-node Slurm on this machine (for tests/slurm and trying the cluster docs).
#
#   sudo bash tools/slurm_up.sh          # prints "slurm up: node <host> idle, <N> CPUs (<s> s)"
#
# As root: installs Debian's slurm-wlm, munge and libpmix2 (srun --mpi=pmix loads it at run
# time), writes /etc/slurm/slurm.conf for one node that declares SLURM_UP_CPUS CPUs (default
# 8; SlurmdParameters=config_overrides lets slurmd accept more CPUs than the machine has, so
# 4-8 ranks can be placed on 2 cores), starts munged, slurmctld and slurmd, and waits until
# `sinfo` shows the node idle. Idempotent: when the node is already idle with this
# configuration it returns at once. Exit status 2 with one line on stderr when it cannot run
# here (not root, no apt-get, a package that will not install; tests/slurm then skips, with
# that line as the reason), 1 when the daemons do not come up.
set -euo pipefail

CPUS=${SLURM_UP_CPUS:-8}
WAIT_S=${SLURM_UP_WAIT_S:-90}
HOST=$(hostname -s)
CONF=/etc/slurm/slurm.conf
START_NS=$(date +%s%N)

say() { echo "slurm up: $*"; }
cannot() { echo "slurm up: cannot start Slurm here: $*" >&2; exit 2; }
broken() { echo "slurm up: Slurm did not come up: $*" >&2; exit 1; }
elapsed() { awk -v ns=$(( $(date +%s%N) - START_NS )) 'BEGIN { printf "%.1f", ns / 1e9 }'; }

node_state() { sinfo -h -n "$HOST" -o %T 2>/dev/null | head -n1; }

[ "$(id -u)" = 0 ] || cannot "not root (it installs packages and starts daemons)"

wanted_conf() {
    cat <<EOF
# Written by nnabla-torus tools/slurm_up.sh: one node, for tests and trying the docs.
ClusterName=nnabla-torus
SlurmctldHost=$HOST(127.0.0.1)
AuthType=auth/munge
CryptoType=crypto/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=/var/lib/slurm/slurmctld
SlurmdSpoolDir=/var/lib/slurm/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
# No cgroups (containers often lack them): processes tracked by their parent, no binding.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=60
NodeName=$HOST NodeAddr=127.0.0.1 CPUs=$CPUS State=UNKNOWN
PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
EOF
}

# Packages (apt-get update only when an install fails: the lists may be stale or absent).
# libpmix-dev: Slurm's mpi/pmix plugin dlopens the unversioned pmix2/lib/libpmix.so.
PACKAGES="slurm-wlm munge libpmix2 libpmix-dev"
missing=$(for p in $PACKAGES; do dpkg -s "$p" >/dev/null 2>&1 || echo "$p"; done)
# Warm: the daemons run with this configuration and the node takes jobs.
if [ -z "$missing" ] && command -v sinfo >/dev/null && [ -f "$CONF" ] && [ "$(wanted_conf)" = "$(cat "$CONF")" ] \
        && pgrep -x slurmctld >/dev/null && pgrep -x slurmd >/dev/null \
        && [[ "$(node_state)" =~ ^(idle|mixed|allocated) ]]; then
    say "node $HOST $(node_state), $CPUS CPUs, already running ($(elapsed) s)"
    exit 0
fi

if [ -n "$missing" ]; then
    command -v apt-get >/dev/null || cannot "no apt-get to install: $missing"
    export DEBIAN_FRONTEND=noninteractive
    say "installing $(echo $missing)"
    if ! apt-get install -y -q --no-install-recommends $missing >/tmp/slurm_up_apt.log 2>&1; then
        apt-get update -q >>/tmp/slurm_up_apt.log 2>&1 || true
        apt-get install -y -q --no-install-recommends $missing >>/tmp/slurm_up_apt.log 2>&1 \
            || cannot "apt-get install $missing failed: $(tail -n1 /tmp/slurm_up_apt.log)"
    fi
fi

# munge: a key, its run folder, the daemon (it refuses to run as root).
if [ ! -s /etc/munge/munge.key ]; then
    mungekey --create --keyfile=/etc/munge/munge.key 2>/dev/null \
        || dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
fi
chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
mkdir -p /run/munge /var/log/munge /var/lib/munge
chown munge:munge /run/munge /var/log/munge /var/lib/munge
if ! pgrep -x munged >/dev/null; then
    runuser -u munge -- /usr/sbin/munged
fi
munge -n | unmunge >/dev/null || broken "munged does not answer (see /var/log/munge/munged.log)"

# Slurm: the configuration, its folders, the daemons (restarted if the configuration changed
# or libpmix2 was installed after slurmd started).
mkdir -p /etc/slurm /var/lib/slurm/slurmctld /var/lib/slurm/slurmd /var/log/slurm
if [ ! -f "$CONF" ] || [ "$(wanted_conf)" != "$(cat "$CONF")" ] || [ -n "$missing" ]; then
    wanted_conf >"$CONF"
    for daemon in slurmd slurmctld; do       # the ones an earlier call started, by pid file
        [ -s "/run/$daemon.pid" ] && kill "$(cat "/run/$daemon.pid")" 2>/dev/null || true
    done
    for _ in $(seq 100); do pgrep -x slurmctld >/dev/null || pgrep -x slurmd >/dev/null || break; sleep 0.1; done
fi
pgrep -x slurmctld >/dev/null || slurmctld -c    # -c: no jobs left from an earlier run
pgrep -x slurmd >/dev/null || slurmd

# Wait until the node takes jobs; a node left down/drained by an earlier run is resumed.
deadline=$(( $(date +%s) + WAIT_S ))
while :; do
    state=$(node_state || true)
    case "$state" in
        idle|mixed|allocated) break ;;
        down*|drain*|fail*) scontrol update nodename="$HOST" state=resume 2>/dev/null || true ;;
    esac
    if [ "$(date +%s)" -ge "$deadline" ]; then
        broken "node $HOST is '${state:-unknown}' after ${WAIT_S} s (see /var/log/slurm/)"
    fi
    sleep 1
done
say "node $HOST idle, $CPUS CPUs ($(elapsed) s)"
