#!/usr/bin/env bash
# Several "hosts" on this machine: network namespaces joined by a bridge,
# each host's link shaped with tc tbf in both directions.
#
#   sudo bench/netns.sh up 4 1gbit      # hosts coll-h0..coll-h3 at 10.77.0.1..4
#   sudo bench/netns.sh run 4 python bench/allreduce_time.py --algos ring
#   sudo bench/netns.sh down 4
#
# "run" starts rank i inside coll-h<i> with the COLLECTIVES_* variables set
# (store on host 0), MASTER_ADDR and GLOO_SOCKET_IFNAME for the gloo peer, and
# COLLECTIVES_TRANSPORT=tcp, since the namespaces still
# share /dev/shm and would otherwise talk through shared memory. Addresses
# live only inside these namespaces. netem (delay, loss) is not in every
# kernel; the rate limit (tbf) is. One rank per host: for several ranks per
# host (a hostname per host, shared memory inside it) use bench/multihost.py.
set -euo pipefail

cmd=${1:-}; n=${2:-4}
BR=coll-br
addr() { echo "10.77.0.$(( $1 + 1 ))"; }

shape() { # namespace, device, rate
  ip netns exec "$1" tc qdisc replace dev "$2" root tbf rate "$3" burst 512kb latency 100ms
}

case "$cmd" in
  up)
    rate=${3:-1gbit}
    ip netns add $BR
    ip netns exec $BR ip link add br0 type bridge
    ip netns exec $BR ip link set br0 up
    ip netns exec $BR ip link set lo up
    for i in $(seq 0 $((n - 1))); do
      h=coll-h$i
      ip netns add $h
      ip link add veth$i netns $h type veth peer name port$i netns $BR
      ip netns exec $BR ip link set port$i master br0
      ip netns exec $BR ip link set port$i up
      ip netns exec $h ip link set lo up
      ip netns exec $h ip addr add "$(addr $i)/24" dev veth$i
      ip netns exec $h ip link set veth$i up
      shape $h veth$i "$rate"     # host -> switch
      shape $BR port$i "$rate"    # switch -> host
    done
    echo "up: $n hosts at $(addr 0)..$(addr $((n - 1))), $rate each way"
    ;;
  down)
    for i in $(seq 0 $((n - 1))); do ip netns del coll-h$i 2>/dev/null || true; done
    ip netns del $BR 2>/dev/null || true
    echo "down"
    ;;
  run)
    shift 2
    port=$(( 20000 + RANDOM % 20000 ))
    pids=()
    trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT INT TERM
    for i in $(seq 0 $((n - 1))); do
      ip netns exec coll-h$i env COLLECTIVES_RANK=$i COLLECTIVES_SIZE=$n \
        COLLECTIVES_LOCAL_RANK=0 COLLECTIVES_LOCAL_SIZE=1 \
        COLLECTIVES_STORE_ADDR="$(addr 0):$port" COLLECTIVES_TRANSPORT=tcp \
        MASTER_ADDR="$(addr 0)" GLOO_SOCKET_IFNAME=veth$i \
        PYTHONPATH="${PYTHONPATH:-}" "$@" &
      pids+=($!)
    done
    rc=0
    for p in "${pids[@]}"; do wait "$p" || rc=$?; done
    trap - EXIT
    exit $rc
    ;;
  *)
    echo "usage: $0 up N RATE | run N cmd... | down N" >&2
    exit 2
    ;;
esac
