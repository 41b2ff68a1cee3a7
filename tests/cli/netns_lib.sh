# Sourced by the tests that run a job on two hosts made of network namespaces
# (tests/cli/netns_hosts.sh): watchdog.sh (lost-host) and tcp_hosts.sh. Needs $src (the source
# directory) and a fail function.

# netns_begin TAG: exits 77 (skipped) where namespaces are not allowed; else builds the hosts
# under the prefix TAG<pid> (exported as ZERO_NETNS_PREFIX for the rsh agent) and removes them
# when the shell exits.
netns_begin() {
  local why
  if ! why=$(bash "$src/tests/cli/netns_hosts.sh" check); then
    echo "SKIPPED: network namespaces are not available here: $why"; exit 77
  fi
  netns_prefix=$1$$
  export ZERO_NETNS_PREFIX=$netns_prefix
  trap 'bash "$src/tests/cli/netns_hosts.sh" down $netns_prefix' EXIT
  bash "$src/tests/cli/netns_hosts.sh" up "$netns_prefix" || fail "could not build the test hosts"
}

# netns_mpirun NP MPIRUN [MPIRUN ARGS...] -- PROGRAM [ARGS...]: NP/2 ranks on each host. mpirun
# runs in the head namespace and starts one orted per host through the rsh agent; the ranks
# talk over TCP on the test network only (shared memory within a host).
netns_mpirun() {
  local np=$1 per=$(($1 / 2))
  shift
  local launcher=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do launcher+=("$1"); shift; done
  shift
  ip netns exec "$netns_prefix-head" "${launcher[@]}" --host "h1:$per,h2:$per" -np "$np" \
    --mca plm_rsh_agent "$src/tests/cli/netns_hosts.sh rsh" --mca plm_rsh_no_tree_spawn 1 \
    --mca btl self,vader,tcp --mca btl_tcp_if_include 10.231.0.0/24 \
    --mca oob_tcp_if_include 10.231.0.0/24 -x ZERO_NETNS_PREFIX "$@"
}
