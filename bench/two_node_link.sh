#!/usr/bin/env bash
# Two "nodes" joined by a slow link (issue 63): two network namespaces and a veth pair whose both
# ends are limited by tc (token bucket, RATE), two workers per node (ddp-run --nnodes 2
# --nproc-per-node 2, Gloo). The same ddp-bench job under DDP, flat FULLY_SHARD over the 4 ranks,
# and hybrid sharding (--dp-replicate 2: a node's two ranks shard, the nodes replicate): its median
# step, the bytes per step ddp-bench counts per group, and the bytes that crossed the link per
# step, read from the veth's counters over two runs of different lengths (their difference
# leaves out the start: rendezvous, rank 0's parameters, the warm-up).
# Needs root (network namespaces).
#
#   bench/two_node_link.sh BUILD_DIR [RATE=1gbit] [MODEL=toy] > table.md
set -euo pipefail
build=$1 rate=${2:-1gbit} model=${3:-toy}
bench="$build/ddp-bench" run="$build/ddp-run"
work=$(mktemp -d /tmp/two_node_link.XXXXXX)
ns0="ddp-l0-$$" ns1="ddp-l1-$$" v0="ddpl0-$$" v1="ddpl1-$$"
v0=${v0:0:15} v1=${v1:0:15}
[[ $(id -u) -eq 0 ]] || { echo "needs root (network namespaces)" >&2; exit 1; }
cleanup() { ip netns del "$ns0" 2>/dev/null || true; ip netns del "$ns1" 2>/dev/null || true; }
trap cleanup EXIT
ip netns add "$ns0"
ip netns add "$ns1"
ip link add "$v0" type veth peer name "$v1"
ip link set "$v0" netns "$ns0"
ip link set "$v1" netns "$ns1"
ip -n "$ns0" addr add 10.78.0.1/24 dev "$v0"
ip -n "$ns1" addr add 10.78.0.2/24 dev "$v1"
for ns in "$ns0" "$ns1"; do ip -n "$ns" link set lo up; done
ip -n "$ns0" link set "$v0" up
ip -n "$ns1" link set "$v1" up
# nsenter --net, not `ip netns exec` (which remounts /: two_node_netns.sh says why).
in_ns() { local ns=$1; shift; nsenter --net="/var/run/netns/$ns" "$@"; }
# The slow link, both directions.
in_ns "$ns0" tc qdisc add dev "$v0" root tbf rate "$rate" burst 256kb latency 400ms
in_ns "$ns1" tc qdisc add dev "$v1" root tbf rate "$rate" burst 256kb latency 400ms
# /proc/net/dev is the reader's namespace's (sysfs would be the host's): field 9 is tx bytes.
tx() { in_ns "$1" awk -v dev="$2:" '$1 == dev { print $10 }' /proc/net/dev; }
port=29811

# One job: ddp-bench --repeat REPEAT with FLAGS on both nodes; prints node 0's JSON line and
# writes the bytes that crossed the link (both directions) to $work/link (it runs in a subshell).
job() {
  local repeat=$1; shift
  local before
  before=$(($(tx "$ns0" "$v0") + $(tx "$ns1" "$v1")))
  port=$((port + 1))
  local common=(--nnodes 2 --nproc-per-node 2 --master-addr 10.78.0.1 --master-port $port --)
  local args=(--model "$model" --batch-size 8 --warmup 2 --repeat "$repeat" --json "$@")
  GLOO_SOCKET_IFNAME=$v1 timeout 900 nsenter --net="/var/run/netns/$ns1" "$run" --node-rank 1 \
    "${common[@]}" "$bench" "${args[@]}" >"$work/node1.log" 2>&1 &
  local node1=$!
  GLOO_SOCKET_IFNAME=$v0 timeout 900 nsenter --net="/var/run/netns/$ns0" "$run" --node-rank 0 \
    "${common[@]}" "$bench" "${args[@]}" >"$work/node0.log" 2>&1 ||
    { cat "$work/node0.log" >&2; wait $node1 || true; cat "$work/node1.log" >&2; exit 1; }
  wait $node1 || { cat "$work/node1.log" >&2; exit 1; }
  echo $(($(tx "$ns0" "$v0") + $(tx "$ns1" "$v1") - before)) >"$work/link"
  grep -h '^\[rank 0\] {' "$work/node0.log" | head -1 | sed 's/^\[rank 0\] //'
}

field() { python3 -c "import json,sys; r=json.loads(sys.argv[1]); print(eval(sys.argv[2]))" "$1" "$2"; }

echo "| run | median step (ms) | bytes across the link per step | bytes per step per group (rank 0, ddp-bench) |"
echo "|---|---|---|---|"
for style in "--ddp" "--fsdp" "--fsdp --dp-replicate 2"; do
  short=$(job 2 $style)
  short_link=$(cat "$work/link")
  long=$(job 6 $style)
  per_step=$((($(cat "$work/link") - short_link) / 4))
  echo "| ddp-bench $style | $(field "$long" 'r["median_ms"]') | $per_step | $(field "$long" 'r.get("bytes_per_step")') |"
done
rm -rf "$work"
