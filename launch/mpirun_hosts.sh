#!/bin/bash
# Starts an MPI job (usually tessera) on the hosts of an Open MPI hostfile.
#
#   launch/mpirun_hosts.sh HOSTFILE NP COMMAND [ARGS...]
#
#   e.g. on two nodes of two GPUs each, TP 2 inside each node and PP 2 across them:
#     launch/mpirun_hosts.sh hosts.txt 4 tessera generate --model DIR --tp 2 --pp 2 ...
#   with hosts.txt:
#     node1 slots=2
#     node2 slots=2
#
# Placement: RANKS_PER_NODE ranks on each host, in the hostfile's order, consecutive ranks on
# the same host (--map-by ppr:N:node --rank-by slot): ranks 0..N-1 on the first host, N..2N-1
# on the second, and so on. tessera numbers ranks with the TP index fastest
# (rank = stage × tp + tp index), so when tp divides N every TP group (the ranks that
# all-reduce every layer) stays inside one node and only pipeline traffic crosses nodes.
# Every host needs slots >= N in the hostfile. Processes are not bound (--bind-to none).
#
# Environment:
#   TESSERA_RANKS_PER_NODE  N above; default: NP divided by the number of hosts, rounded up.
#   TESSERA_MPI_IF          where Open MPI's own TCP traffic goes (its out-of-band channel and
#                           the TCP BTL): comma-separated subnets (10.0.0.0/24) or interface
#                           names (eth1), given to oob_tcp_if_include and btl_tcp_if_include.
#   TESSERA_MPIRUN_ARGS     more mpirun options, split at spaces (e.g. "--mca plm_rsh_agent X").
#   MPIRUN                  the mpirun to run (default: mpirun from PATH).
# Every NCCL_*, OMP_* and OPENBLAS_* variable set here is passed to every rank (-x): ranks
# started on other hosts through ssh do not inherit this shell's environment. So are the
# sanitizers' ASAN_OPTIONS, LSAN_OPTIONS, UBSAN_OPTIONS and TSAN_OPTIONS (a build made with
# --config=asan or tsan: their suppression files, docs/RELIABILITY.md "Sanitizers").
set -u

usage() {
  echo "usage: $0 HOSTFILE NP COMMAND [ARGS...]" >&2
  exit 2
}
[ $# -ge 3 ] || usage
hostfile="$1"
np="$2"
shift 2
if [ ! -r "$hostfile" ]; then
  echo "mpirun_hosts: cannot read hostfile '$hostfile'" >&2
  exit 2
fi
case "$np" in
  '' | *[!0-9]* | 0) echo "mpirun_hosts: NP must be a positive integer, not '$np'" >&2; exit 2 ;;
esac

hosts=$(awk '$1 !~ /^#/ && NF > 0 { print $1 }' "$hostfile" | sort -u | wc -l)
if [ "$hosts" -eq 0 ]; then
  echo "mpirun_hosts: no hosts in '$hostfile'" >&2
  exit 2
fi
per_node="${TESSERA_RANKS_PER_NODE:-$(((np + hosts - 1) / hosts))}"
case "$per_node" in
  '' | *[!0-9]* | 0)
    echo "mpirun_hosts: TESSERA_RANKS_PER_NODE must be a positive integer, not '$per_node'" >&2
    exit 2
    ;;
esac

args=(--hostfile "$hostfile" -np "$np" --map-by "ppr:$per_node:node" --rank-by slot
  --bind-to none)
if [ -n "${TESSERA_MPI_IF:-}" ]; then
  args+=(--mca oob_tcp_if_include "$TESSERA_MPI_IF" --mca btl_tcp_if_include "$TESSERA_MPI_IF")
fi
while IFS= read -r name; do
  args+=(-x "$name")
done < <(compgen -e | grep -E '^(NCCL|OMP|OPENBLAS)_|^(A|L|UB|T)SAN_OPTIONS$')
if [ -n "${TESSERA_MPIRUN_ARGS:-}" ]; then
  read -r -a extra <<<"$TESSERA_MPIRUN_ARGS"
  args+=("${extra[@]}")
fi

exec "${MPIRUN:-mpirun}" "${args[@]}" "$@"
