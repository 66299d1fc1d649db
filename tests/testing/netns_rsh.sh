#!/bin/bash
# An rsh/ssh stand-in for Open MPI that "logs in" to a host by entering the network namespace
# that owns it, so one machine can play several hosts (tests/multihost_test.sh):
#
#   mpirun --mca plm_rsh_agent tests/testing/netns_rsh.sh --hostfile HOSTS ...
#
# Open MPI 4.1 calls the agent like ssh: `AGENT [plm_rsh_args...] HOST WORD...`, where the
# WORDs (" orted" -mca ess "env" ...) form one command line for the remote login shell, quotes
# included. Like ssh, this joins them with spaces and runs them with the user's login shell,
# here inside `ip netns exec NS`, in a UTS namespace of its own whose hostname is NS (so each
# "host" has its own name), and with a fresh environment as an ssh login would have: only
# PATH, HOME, USER, LOGNAME, SHELL and the NETNS_RSH_* variables survive; everything else a
# rank needs must be sent by mpirun (-x).
#
# NETNS_RSH_MAP: the hosts, as space-separated HOST=NAMESPACE pairs
#   (e.g. "10.213.5.1=ns-a 10.213.5.2=ns-b"). A host that is not listed is an error.
# Needs root (CAP_SYS_ADMIN) for ip netns exec and unshare.
set -u

# Options before the host, as ssh takes them (Open MPI passes plm_rsh_args there, e.g. -x).
while [ $# -gt 0 ]; do
  case "$1" in
    --) shift; break ;;
    -[BbcDEeFIiJLlmOoPpQRSWw]) shift 2 ;;  # ssh options that take a separate value
    -*) shift ;;
    *) break ;;
  esac
done
if [ $# -lt 2 ]; then
  echo "netns_rsh: usage: netns_rsh.sh [options] HOST COMMAND..." >&2
  exit 255
fi
host="${1#*@}"  # user@host: the user is ignored
shift

ns=""
for pair in ${NETNS_RSH_MAP:-}; do
  if [ "${pair%%=*}" = "$host" ]; then
    ns="${pair#*=}"
    break
  fi
done
if [ -z "$ns" ]; then
  echo "netns_rsh: no network namespace for host '$host' (NETNS_RSH_MAP='${NETNS_RSH_MAP:-}')" >&2
  exit 255
fi

user="$(id -un)"
login_shell="$(getent passwd "$user" | cut -d: -f7)"
[ -x "${login_shell:-}" ] || login_shell=/bin/sh
# The ssh-like clean environment, keeping this agent's own settings for a tree spawn (an orted
# that launches further daemons runs this agent again, from inside a namespace).
clean_env=(env -i "PATH=$PATH" "HOME=${HOME:-/}" "USER=$user" "LOGNAME=$user"
  "SHELL=$login_shell" "NETNS_RSH_MAP=${NETNS_RSH_MAP:-}")
# shellcheck disable=SC2016
exec ip netns exec "$ns" unshare --uts "${clean_env[@]}" "$login_shell" -c \
  'hostname "$0" && exec "$1" -c "$2"' "$ns" "$login_shell" "$*"
