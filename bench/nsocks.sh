#!/usr/bin/env bash
# COLLECTIVES_NSOCKS across two network namespaces joined by one veth pair
# (issue 21, section 4; bench/README.md "Many sockets per peer").
#
#   bench/nsocks.sh [ROUNDS] [LINKS] [PREFIX]       # as root
#   bench/nsocks.sh 3 "2gbit none" n21
#
# Builds PREFIX-h0 (10.81.0.1) and PREFIX-h1 (10.81.0.2), one rank in each,
# and per link setting (a tbf rate on both ends, or "none": unshaped), per
# round, one after the other: iperf3 -P 1 and -P 4, our 64 MiB in-place ring
# allreduce with COLLECTIVES_NSOCKS=1, 2, 4, 8, and gloo's. Prints one line per
# measurement (Gbit/s for iperf3, busbw GB/s for the allreduces) and deletes
# the namespaces at the end. Traffic never leaves them.
set -euo pipefail

rounds=${1:-3}
links=${2:-"2gbit none"}
P=${3:-n21}
A=$P-h0 B=$P-h1 IPA=10.81.0.1 IPB=10.81.0.2
SIZE=${NSOCKS_BENCH_SIZE:-64M}
PY=${PYTHON:-python}

down() { ip netns del "$A" 2>/dev/null || true; ip netns del "$B" 2>/dev/null || true; }
trap down EXIT
down
ip netns add "$A"
ip netns add "$B"
ip link add "${P}a" netns "$A" type veth peer name "${P}b" netns "$B"
for ns in "$A:${P}a:$IPA" "$B:${P}b:$IPB"; do
  IFS=: read -r n dev ip <<<"$ns"
  ip netns exec "$n" ip link set lo up
  ip netns exec "$n" ip addr add "$ip/24" dev "$dev"
  ip netns exec "$n" ip link set "$dev" up
done

shape() {
  for ns in "$A:${P}a" "$B:${P}b"; do
    IFS=: read -r n dev <<<"$ns"
    ip netns exec "$n" tc qdisc del dev "$dev" root 2>/dev/null || true
    [ "$1" = none ] || ip netns exec "$n" tc qdisc replace dev "$dev" root tbf rate "$1" \
      burst 512kb latency 100ms
  done
}

iperf() { # streams -> Gbit/s received
  ip netns exec "$B" iperf3 -s -1 >/dev/null 2>&1 &
  local srv=$!
  sleep 0.3
  ip netns exec "$A" iperf3 -c "$IPB" -t 3 -P "$1" -J |
    "$PY" -c 'import json,sys; print("%.2f" % (json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"] / 1e9))'
  wait "$srv" || true
}

pair() { # env... -- cmd...: rank 0 in A, rank 1 in B; prints rank 0's busbw at SIZE
  local port=$((20000 + RANDOM % 20000)) out
  out=$(mktemp)
  local common=(COLLECTIVES_SIZE=2 COLLECTIVES_LOCAL_RANK=0 COLLECTIVES_LOCAL_SIZE=1
                COLLECTIVES_STORE_ADDR=$IPA:$port COLLECTIVES_TRANSPORT=tcp MASTER_ADDR=$IPA)
  ip netns exec "$A" env "${common[@]}" COLLECTIVES_RANK=0 GLOO_SOCKET_IFNAME="${P}a" "$@" >"$out" 2>&1 &
  local r0=$!
  ip netns exec "$B" env "${common[@]}" COLLECTIVES_RANK=1 GLOO_SOCKET_IFNAME="${P}b" "$@" >/dev/null 2>&1 &
  local r1=$!
  wait "$r0" || true
  wait "$r1" || true
  # nccl-tests row: size count type redop root, then time algbw busbw #wrong out of place
  # and the same in place: the in-place busbw is the row's second-to-last field
  "$PY" - "$out" <<'EOF'
import re, sys
rows = [l.split() for l in open(sys.argv[1]) if re.match(r"\s*\d+\s+\d+\s+float", l)]
print(rows[-1][-2] if rows else "failed: " + open(sys.argv[1]).read()[-300:].replace("\n", " | "))
EOF
  rm -f "$out"
}

bench=(-m collectives.bench allreduce -b "$SIZE" -e "$SIZE" --iters 5 --warmup 2)
for link in $links; do
  shape "$link"
  for r in $(seq 1 "$rounds"); do
    echo "link=$link round=$r iperf3_P1_gbit=$(iperf 1) iperf3_P4_gbit=$(iperf 4)"
    for k in 1 2 4 8; do
      echo "link=$link round=$r ours_nsocks=$k busbw_GBps=$(pair COLLECTIVES_NSOCKS=$k "$PY" "${bench[@]}" --algo ring)"
    done
    echo "link=$link round=$r gloo busbw_GBps=$(pair "$PY" -m collectives.bench.peer_worker gloo --port $((20000 + RANDOM % 20000)) "${bench[@]:2}")"
  done
done
