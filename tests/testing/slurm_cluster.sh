# shellcheck shell=bash
# A private one-node Slurm cluster for tests (source this file; bash only).
#
#   source tests/testing/slurm_cluster.sh
#   trap slurm_cluster_stop EXIT
#   slurm_cluster_start || exit 1   # exports SLURM_CONF; srun/sbatch/sinfo then use it
#   timeout 60 srun -n 2 --mpi=pmix ...
#
# slurm_cluster_start starts, in a fresh directory $SLURM_CLUSTER_DIR under /tmp, everything
# from scratch: munged with its own key, socket, pid, seed and log; then slurmctld and slurmd
# (in the foreground, -D, as children of this shell, so their PIDs are known) with a generated
# slurm.conf: a unique ClusterName, two free ports, SlurmctldHost = NodeName = `hostname -s`,
# CPUs = nproc (ignoring OMP_NUM_THREADS), MpiDefault=pmix, proctrack/linuxproc, task/none,
# select/cons_tres, no accounting, every state/spool/log/pid path in that directory. Nothing of
# the machine's own Slurm or munge (/etc/slurm, /run/munge) is read or touched, and a cluster
# the machine already runs is not disturbed. It then waits (up to 60 s) until the node is
# idle; on failure it prints why and the daemons' logs, and returns 1.
#
# slurm_cluster_stop (idempotent; call it from an EXIT trap) cancels the cluster's jobs, stops
# slurmd, slurmctld and munged by PID (SIGTERM, up to 5 s, then SIGKILL), then SIGKILLs any
# process left over from the cluster's jobs (slurmstepd, tasks), found by SLURM_CONF=<this
# cluster's slurm.conf> in its environment -- never by name -- and removes the directory.
#
# Needs root (slurmd runs job steps as their user; SlurmUser=root) and the Debian packages
# slurmctld, slurmd, slurm-client and munge (tools/setup.sh installs them).

SLURM_CLUSTER_DIR=""
SLURM_CLUSTER_PIDS=()  # munged, slurmctld, slurmd: children of this shell

# Runs as long as process $1 exists and is not a zombie.
_slurm_cluster_alive() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }  # the state follows the parenthesised command name
  [[ "${stat%% *}" != Z ]]
}

# Sets the variable named $1 to a TCP port in 20000-59999 that nothing on this host listens on
# and that is none of the ports $2... .
_slurm_cluster_free_port() {
  local var="$1" port tries
  shift
  for ((tries = 0; tries < 200; tries++)); do
    port=$((20000 + (RANDOM * 32768 + RANDOM) % 40000))
    [[ " $* " == *" $port "* ]] && continue
    # A connection that succeeds means something listens there.
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      printf -v "$var" '%s' "$port"
      return 0
    fi
  done
  return 1
}

slurm_cluster_dump_logs() {
  local f
  [[ -n "$SLURM_CLUSTER_DIR" ]] || return 0
  for f in "$SLURM_CLUSTER_DIR"/log/*; do
    [[ -f "$f" ]] || continue
    echo "----- $(basename "$f") (last 40 lines) -----"
    tail -n 40 "$f"
  done
}

_slurm_cluster_fail() {
  echo "slurm_cluster: $*" >&2
  slurm_cluster_dump_logs >&2
  return 1
}

slurm_cluster_start() {
  export PATH="$PATH:/usr/sbin:/sbin"
  local tool
  for tool in munged munge slurmctld slurmd srun sbatch sinfo squeue scancel; do
    command -v "$tool" >/dev/null ||
      { echo "slurm_cluster: $tool not found (run tools/setup.sh as root)" >&2; return 1; }
  done
  if [[ "$(id -u)" != 0 ]]; then
    echo "slurm_cluster: must run as root (slurmd starts job steps as their user)" >&2
    return 1
  fi

  # Short paths: munged's, slurmd's and PMIx's UNIX sockets live here (at most 108 bytes), and
  # Bazel's TEST_TMPDIR is too long for them.
  SLURM_CLUSTER_DIR=$(mktemp -d /tmp/tslurm.XXXXXX) || return 1
  local d="$SLURM_CLUSTER_DIR"
  chmod 755 "$d"  # munged wants the socket's directory searchable by all
  mkdir -p "$d/state" "$d/spool" "$d/log" "$d/munge"
  chmod 700 "$d/munge"

  # munged (as root: --force accepts that and the key's owner) with a fresh 1 KiB key.
  head -c 1024 /dev/urandom >"$d/munge/munge.key"
  chmod 600 "$d/munge/munge.key"
  munged --foreground --force --key-file="$d/munge/munge.key" --socket="$d/munge.sock" \
    --pid-file="$d/munge/munged.pid" --seed-file="$d/munge/munged.seed" \
    --log-file="$d/log/munged.log" >"$d/log/munged.out" 2>&1 &
  SLURM_CLUSTER_PIDS+=($!)
  local i
  for ((i = 0; i < 100; i++)); do
    munge -S "$d/munge.sock" -n >/dev/null 2>&1 && break
    _slurm_cluster_alive "${SLURM_CLUSTER_PIDS[0]}" || break
    sleep 0.1
  done
  if ! munge -S "$d/munge.sock" -n >/dev/null 2>&1; then
    _slurm_cluster_fail "munged did not start"
    return 1
  fi

  local host ctld_port slurmd_port
  host=$(hostname -s)
  # The node's CPUs as slurmd counts them: nproc without OMP_NUM_THREADS / OMP_THREAD_LIMIT,
  # which GNU nproc obeys (tests set OMP_NUM_THREADS=1; CPUs=1 would make -n 2 wait forever).
  local cpus
  cpus=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
  if ! _slurm_cluster_free_port ctld_port || ! _slurm_cluster_free_port slurmd_port "$ctld_port"
  then
    _slurm_cluster_fail "no free TCP port"
    return 1
  fi
  # ClusterName: lower case letters and digits, unique per start.
  SLURM_CLUSTER_NAME="tt$(printf '%x%04x' "$$" "$RANDOM")"
  cat >"$d/slurm.conf" <<EOF
# Generated by tests/testing/slurm_cluster.sh for one test run.
ClusterName=$SLURM_CLUSTER_NAME
SlurmctldHost=$host
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$d/munge.sock
MpiDefault=pmix
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MailProg=/bin/true
ReturnToService=2
KillWait=5
# sbatch --wait polls every 2 s while MinJobAge / 2 <= 2 (else after 2 s, then every 8 s).
MinJobAge=5
InactiveLimit=0
StateSaveLocation=$d/state
SlurmdSpoolDir=$d/spool
SlurmctldPidFile=$d/slurmctld.pid
SlurmdPidFile=$d/slurmd.pid
SlurmctldLogFile=$d/log/slurmctld.log
SlurmdLogFile=$d/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
NodeName=$host CPUs=$cpus State=UNKNOWN
PartitionName=test Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
  export SLURM_CONF="$d/slurm.conf"

  slurmctld -D -i -f "$SLURM_CONF" >"$d/log/slurmctld.out" 2>&1 &
  SLURM_CLUSTER_PIDS+=($!)
  slurmd -D -f "$SLURM_CONF" >"$d/log/slurmd.out" 2>&1 &
  SLURM_CLUSTER_PIDS+=($!)

  local state="" pid
  for ((i = 0; i < 120; i++)); do
    state=$(timeout 5 sinfo -h -n "$host" -o %T 2>/dev/null)
    [[ "$state" == idle ]] && break
    for pid in "${SLURM_CLUSTER_PIDS[@]}"; do
      _slurm_cluster_alive "$pid" ||
        { _slurm_cluster_fail "a daemon (pid $pid) exited while starting"; return 1; }
    done
    sleep 0.5
  done
  if [[ "$state" != idle ]]; then
    _slurm_cluster_fail "node $host not idle after 60 s (state: '${state:-no answer}')"
    return 1
  fi
  echo "slurm_cluster: cluster $SLURM_CLUSTER_NAME up in $d" \
    "(node $host, ports $ctld_port/$slurmd_port)"
}

# Sends $1 to process $2 and waits up to 5 s for it to end, then SIGKILLs it.
_slurm_cluster_kill() {
  local sig="$1" pid="$2" i
  kill "-$sig" "$pid" 2>/dev/null
  for ((i = 0; i < 50; i++)); do
    _slurm_cluster_alive "$pid" || break
    sleep 0.1
  done
  _slurm_cluster_alive "$pid" && kill -KILL "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null  # reap it if it is our child
  return 0
}

slurm_cluster_stop() {
  local d="$SLURM_CLUSTER_DIR" conf i pid
  [[ -n "$d" ]] || return 0
  conf="$d/slurm.conf"
  # Cancel this cluster's jobs first, so that slurmd ends their steps. Bounded to a few
  # seconds: Bazel gives a test that timed out 15 s after SIGTERM before it SIGKILLs it.
  if [[ -f "$conf" ]] && ((${#SLURM_CLUSTER_PIDS[@]} == 3)) &&
    _slurm_cluster_alive "${SLURM_CLUSTER_PIDS[1]}" &&
    _slurm_cluster_alive "${SLURM_CLUSTER_PIDS[2]}"; then
    SLURM_CONF="$conf" timeout 3 scancel -u "$(id -un)" >/dev/null 2>&1
    for ((i = 0; i < 8; i++)); do
      [[ -z "$(SLURM_CONF="$conf" timeout 2 squeue -h 2>/dev/null)" ]] && break
      sleep 0.5
    done
  fi
  # slurmd, slurmctld, munged: last started, first stopped.
  for ((i = ${#SLURM_CLUSTER_PIDS[@]} - 1; i >= 0; i--)); do
    _slurm_cluster_kill TERM "${SLURM_CLUSTER_PIDS[i]}"
  done
  SLURM_CLUSTER_PIDS=()
  # Whatever the cluster's jobs left (slurmstepd, tasks): their environment names this
  # cluster's slurm.conf, which no other process on the machine has (unset it here so that
  # the grep below does not find itself).
  [[ "${SLURM_CONF:-}" == "$conf" ]] && unset SLURM_CONF
  # shellcheck disable=SC2013  # one PID a line
  for pid in $(grep -lsxzF "SLURM_CONF=$conf" /proc/[0-9]*/environ 2>/dev/null |
    cut -d/ -f3); do
    [[ "$pid" == "$$" || "$pid" == "$BASHPID" ]] && continue
    echo "slurm_cluster: killing leftover process $pid:" \
      "$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null)" >&2
    kill -KILL "$pid" 2>/dev/null
  done
  rm -rf "$d"
  SLURM_CLUSTER_DIR=""
}
