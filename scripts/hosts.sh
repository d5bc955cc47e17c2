#!/usr/bin/env bash
# Hosts of our own on one machine: network namespaces joined by veth pairs to a bridge, each with
# its own address (10.77.0.<i+1>), host name (a UTS namespace) and /dev/shm (a mount namespace, so
# node-local files stay node-local), and Open MPI's launcher reaching each one through a small rsh
# agent (`ip netns exec`). Ranks on one host talk over shared memory, ranks on different hosts over
# TCP across the veths, where `ip -s link` counts every byte and `tc` can cap a link. Needs root.
#
# usage: scripts/hosts.sh up N [R]        N hosts with R slots each (default 2)
#        scripts/hosts.sh run CMD...      CMD on host 0, where mpirun (or shardlab --nproc K) places
#                                         its ranks on the hosts, R consecutive ranks to a host
#        scripts/hosts.sh with N R CMD...  up, CMD (SHARDLAB_HOSTS_TAG exported), down, whatever CMD does
#        scripts/hosts.sh exec I CMD...   CMD on host I (its namespaces)
#        scripts/hosts.sh link I up|down  set host I's link up or down (up: usable when it returns)
#        scripts/hosts.sh cap I RATE|off  cap host I's link both ways at RATE (tc tbf: 1gbit, 10gbit)
#        scripts/hosts.sh bytes I         "rx tx" bytes host I's link has carried, seen from the host
#        scripts/hosts.sh clean I         end every process on host I (what a resource manager does after a fault)
#        scripts/hosts.sh down            remove the hosts, their processes and the state
# Several sets of hosts coexist under different SHARDLAB_HOSTS_TAG values (default "sl"; at most 6
# letters and digits): names are <tag>-h<i> (namespaces), <tag>br (bridge), <tag>v<i> (the bridge's
# end of host i's veth); the state (hostfile, agent) lives in /run/shardlab-hosts/<tag>. No
# address is given to the machine itself: mpirun runs inside host 0, so sets never conflict.
set -euo pipefail
shopt -s inherit_errexit  # a failure inside $(...) ends the script too
tag=${SHARDLAB_HOSTS_TAG:-sl}
[[ $tag =~ ^[a-z0-9]{1,6}$ ]] || { echo "hosts.sh: SHARDLAB_HOSTS_TAG='$tag': expected 1-6 lowercase letters or digits" >&2; exit 2; }
state=/run/shardlab-hosts/$tag
net=10.77.0
die() { echo "hosts.sh: $*" >&2; exit 2; }
count() { [ -f "$state/count" ] || die "no hosts under tag '$tag' (run: scripts/hosts.sh up N)"; cat "$state/count"; }
host_index() {  # validates I against the hosts that exist
  local n; n=$(count) || exit 2
  [[ $1 =~ ^[0-9]+$ ]] && [ "$1" -lt "$n" ] || die "host '$1': expected 0..$((n - 1))"
  echo "$1"
}

up() {
  local n=$1 r=${2:-2}
  [[ $n =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 64 ] || die "up $n: expected 1..64 hosts"
  [[ $r =~ ^[0-9]+$ ]] && [ "$r" -ge 1 ] || die "up $n $r: expected a positive number of slots per host"
  [ "$(id -u)" = 0 ] || die "needs root (network namespaces, veth, tc)"
  [ ! -e "$state" ] || die "hosts under tag '$tag' exist already (scripts/hosts.sh down first)"
  mkdir -p "$state"
  echo "$n" >"$state/count"
  ip link add "${tag}br" type bridge
  ip link set "${tag}br" up
  : >"$state/hostfile"
  for ((i = 0; i < n; i++)); do
    ip netns add "$tag-h$i"
    ip link add "${tag}v$i" type veth peer name eth0 netns "$tag-h$i"
    ip link set "${tag}v$i" master "${tag}br" up
    ip -n "$tag-h$i" addr add "$net.$((i + 1))/24" dev eth0
    ip -n "$tag-h$i" link set eth0 up
    ip -n "$tag-h$i" link set lo up
    echo "$net.$((i + 1)) slots=$r" >>"$state/hostfile"
  done
  # The rsh agent Open MPI calls as `agent HOST COMMAND...`: the host's namespaces, a fresh /dev/shm.
  cat >"$state/agent" <<EOF
#!/usr/bin/env bash
host=\$1; shift
case \$host in $net.*) i=\$((\${host##*.} - 1)) ;; *) echo "hosts agent: unknown host '\$host'" >&2; exit 255 ;; esac
exec ip netns exec "$tag-h\$i" unshare --uts --mount bash -c \\
  "hostname $tag-h\$i && mount -t tmpfs -o mode=1777 tmpfs /dev/shm && \$*"
EOF
  chmod +x "$state/agent"
  echo "$n hosts ($tag-h0..$tag-h$((n - 1)), $net.1..$net.$n, $r slots each); hostfile $state/hostfile"
}

down() {
  local n i
  n=$(cat "$state/count" 2>/dev/null || echo 64)
  for ((i = 0; i < n; i++)); do
    if ip netns pids "$tag-h$i" >/dev/null 2>&1; then
      ip netns pids "$tag-h$i" | xargs -r kill -KILL 2>/dev/null || true
      ip netns del "$tag-h$i" 2>/dev/null || true
    fi
    ip link del "${tag}v$i" 2>/dev/null || true
  done
  ip link del "${tag}br" 2>/dev/null || true
  rm -rf "$state"
}

run() {
  [ -f "$state/hostfile" ] || die "no hosts under tag '$tag' (run: scripts/hosts.sh up N)"
  [ $# -ge 1 ] || die "run: expected a command (build/shardlab ... --nproc K, or mpirun -np K ...)"
  # Open MPI reads these from the environment: mpirun, and shardlab's --nproc launcher with it,
  # places the ranks by the hostfile, slot by slot (consecutive ranks share a host). The hosts share
  # this machine's cores, which no host's slot count says: a rank waiting in MPI yields its core
  # instead of polling on it (as Open MPI does by itself when it knows a host is oversubscribed).
  # Open MPI's session directories go to each host's own /dev/shm: under the shared /tmp, a daemon
  # left from a job that lost its host removed a new daemon's files as it went.
  export OMPI_MCA_mpi_yield_when_idle=1 OMPI_MCA_orte_tmpdir_base=/dev/shm \
    OMPI_MCA_orte_default_hostfile="$state/hostfile" OMPI_MCA_plm_rsh_agent="$state/agent" \
    OMPI_MCA_plm_rsh_no_tree_spawn=1 OMPI_MCA_btl=tcp,vader,self OMPI_MCA_btl_tcp_if_include="$net.0/24" \
    OMPI_MCA_oob_tcp_if_include="$net.0/24" OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  "$state/agent" "$net.1" "$(printf '%q ' "$@")"
}

case ${1:-} in
up) shift; up "$@" ;;
down) down ;;
run) shift; run "$@" ;;
with)
  shift
  [ $# -ge 3 ] || die "with N R CMD...: expected hosts, slots and a command"
  n=$1 r=$2; shift 2
  trap down EXIT
  trap 'exit 130' INT TERM
  up "$n" "$r" >/dev/null
  SHARDLAB_HOSTS_TAG=$tag "$@"
  ;;
exec)
  i=$(host_index "${2:-x}"); shift 2
  [ $# -gt 0 ] || die "exec $i: give the command to run on host $i (scripts/hosts.sh exec $i CMD [ARGS...])"
  "$state/agent" "$net.$((i + 1))" "$(printf '%q ' "$@")"
  ;;
link)
  i=$(host_index "${2:-x}")
  [[ ${3:-} =~ ^(up|down)$ ]] || die "link $i ${3:-}: expected up or down"
  ip link set "${tag}v$i" "$3"
  if [ "$3" = up ]; then
    # Address resolutions begun while the link was down would still fail (an INCOMPLETE entry whose
    # last probe went out before the link returned fails what waits on it: a connect then gets
    # EHOSTUNREACH). Forget them on both ends so the next packet resolves over the working link.
    ip -n "$tag-h$i" neigh flush dev eth0
    n=$(count) || exit 2
    for ((j = 0; j < n; ++j)); do
      [ "$j" = "$i" ] || ip -n "$tag-h$j" neigh flush dev eth0 to "$net.$((i + 1))"
    done
  fi
  ;;
cap)
  i=$(host_index "${2:-x}")
  rate=${3:-}
  [[ $rate =~ ^([0-9]+)(k|m|g)bit$ || $rate = off ]] || die "cap $i '$rate': expected a rate (100mbit, 1gbit, 10gbit) or off"
  if [ "$rate" != off ]; then
    # A burst of 4 ms at the rate (at least 64 KiB: a full TSO segment), a queue of 50 ms.
    unit=1000; [ "${BASH_REMATCH[2]}" = m ] && unit=1000000; [ "${BASH_REMATCH[2]}" = g ] && unit=1000000000
    bits=$((BASH_REMATCH[1] * unit))
    burst=$((bits / 8 / 250)); [ "$burst" -ge 65536 ] || burst=65536
  fi
  for dev in "${tag}v$i" eth0; do
    ns=(); [ "$dev" = eth0 ] && ns=(-n "$tag-h$i")
    tc "${ns[@]}" qdisc del dev "$dev" root 2>/dev/null || true
    [ "$rate" = off ] || tc "${ns[@]}" qdisc add dev "$dev" root tbf rate "$rate" burst "$burst" latency 50ms
  done
  ;;
clean)
  i=$(host_index "${2:-x}")
  ip netns pids "$tag-h$i" | xargs -r kill -KILL 2>/dev/null || true
  ;;
bytes)
  i=$(host_index "${2:-x}")
  ip -n "$tag-h$i" -s -j link show eth0 | python3 -c \
    'import json,sys; s=json.load(sys.stdin)[0]["stats64"]; print(s["rx"]["bytes"], s["tx"]["bytes"])'
  ;;
*) awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$0"; [ -z "${1:-}" ] || exit 2 ;;
esac
