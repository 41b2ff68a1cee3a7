#!/usr/bin/env bash
# Two test "hosts" on one machine, made of network namespaces, for tests of what crosses a
# network (tests/cli/watchdog.sh). Only namespaces this script creates are touched; nothing is
# added to the machine's own network namespace.
#
#   netns_hosts.sh up PREFIX      creates PREFIX-head (a bridge, 10.231.0.1: where mpirun runs,
#                                 like a login node), PREFIX-h1 (10.231.0.11) and PREFIX-h2
#                                 (10.231.0.12), each host wired to the bridge by a veth pair
#   netns_hosts.sh cut PREFIX H   takes host H's link down at the bridge (a pulled cable: its
#                                 packets are dropped, nobody is told)
#   netns_hosts.sh down PREFIX    kills every process left in the namespaces and removes them
#   netns_hosts.sh rsh HOST CMD.. Open MPI's rsh agent (plm_rsh_agent): runs CMD in host HOST's
#                                 namespace (PREFIX from $ZERO_NETNS_PREFIX) with its own host
#                                 name, so that the ranks there report "h1" / "h2"
#   netns_hosts.sh check          exit 0 if namespaces can be made here, else 1 with the reason
set -euo pipefail
cmd=${1:?usage: netns_hosts.sh up|cut|down|rsh|check ...}
shift

case $cmd in
  check)
    probe="zt-probe-$$"
    if ! out=$(ip netns add "$probe" 2>&1); then echo "cannot create a network namespace: $out"; exit 1; fi
    ok=1
    ip -n "$probe" link add br0 type bridge 2>/dev/null || ok=0
    unshare --uts true 2>/dev/null || ok=0
    ip netns del "$probe"
    [ $ok -eq 1 ] || { echo "cannot create a bridge or a UTS namespace here"; exit 1; }
    ;;
  up)
    p=${1:?prefix}
    ip netns add "$p-head"; ip netns add "$p-h1"; ip netns add "$p-h2"
    ip -n "$p-head" link add br0 type bridge
    ip -n "$p-head" addr add 10.231.0.1/24 dev br0
    ip -n "$p-head" link set br0 up
    ip -n "$p-head" link set lo up
    # The login node gives up on a silent TCP peer after seconds, not ~15 minutes (Linux's
    # default tcp_retries2 = 15): how long mpirun waits for the daemon of a lost host once it has
    # asked it to end the job. docs/reliability.md recommends the same on real login nodes.
    ip netns exec "$p-head" sysctl -q -w net.ipv4.tcp_retries2="${ZERO_NETNS_TCP_RETRIES2:-5}"
    for i in 1 2; do
      ip -n "$p-h$i" link add eth0 type veth peer name port$i netns "$p-head"
      ip -n "$p-h$i" addr add "10.231.0.1$i/24" dev eth0
      ip -n "$p-h$i" link set eth0 up
      ip -n "$p-h$i" link set lo up
      ip -n "$p-head" link set port$i master br0
      ip -n "$p-head" link set port$i up
    done
    for i in 1 2; do
      ip netns exec "$p-head" ping -c 1 -W 2 "10.231.0.1$i" >/dev/null 2>&1 ||
        ip netns exec "$p-head" bash -c "exec 3<>/dev/tcp/10.231.0.1$i/9" 2>/dev/null || true
    done
    ;;
  cut)
    p=${1:?prefix} h=${2:?host}
    ip -n "$p-head" link set "port${h#h}" down
    ;;
  down)
    p=${1:?prefix}
    for ns in "$p-head" "$p-h1" "$p-h2"; do
      pids=$(ip netns pids "$ns" 2>/dev/null || true)
      [ -n "$pids" ] && kill -9 $pids 2>/dev/null || true
    done
    sleep 0.2
    for ns in "$p-head" "$p-h1" "$p-h2"; do ip netns del "$ns" 2>/dev/null || true; done
    ;;
  rsh)
    host=${1:?host}
    shift
    p=${ZERO_NETNS_PREFIX:?ZERO_NETNS_PREFIX must name the hosts\' prefix}
    # Open MPI hands the remote command as words, as ssh would: run them through a shell.
    exec ip netns exec "$p-$host" unshare --uts sh -c 'hostname "$0" && exec sh -c "$1"' "$host" "$*"
    ;;
  *) echo "netns_hosts.sh: unknown command $cmd" >&2; exit 2 ;;
esac
