#!/usr/bin/env bash
# Multi-node without a cluster: two network namespaces joined by a veth pair stand for two hosts.
# One ddp-run per "node" (--nnodes 2, one worker each, Gloo over the veth link) must produce the
# same final parameters, bit for bit, as the same job on one node (two workers on loopback).
# Needs root (network namespaces); without it, exits 77, which CTest reports as skipped.
#
#   two_node_netns.sh DDP_RUN DDP_TRAIN WORKDIR
set -euo pipefail
ddp_run=$1 ddp_train=$2 work=$3
mkdir -p "$work"
ns0="ddp-node0-$$" ns1="ddp-node1-$$" veth0="ddpv0-$$" veth1="ddpv1-$$"
veth0=${veth0:0:15} veth1=${veth1:0:15}  # interface names are at most 15 characters

skip() { echo "SKIP: $*"; exit 77; }
[[ $(id -u) -eq 0 ]] || skip "needs root to create network namespaces (running as uid $(id -u))"
command -v ip >/dev/null || skip "needs the ip command (Debian package iproute2)"
command -v nsenter >/dev/null || skip "needs nsenter (Debian package util-linux)"
cleanup() {
  ip netns del "$ns0" 2>/dev/null || true
  ip netns del "$ns1" 2>/dev/null || true
}
trap cleanup EXIT
# Setting up the two hosts is the probe: a machine that cannot (no veth, no namespaces in a
# container) skips with the reason. Commands run inside a namespace through nsenter --net, not `ip
# netns exec`: the latter also remounts / as a slave ("mount --make-rslave /"), which fails where
# the root is not a mount point (chroots, some containers), and only the network is needed here.
setup_step() {  # command...: runs it, or skips naming the command and its error
  "$@" 2>"$work/netns.err" || skip "cannot set up network namespaces here: '$*' failed: $(cat "$work/netns.err")"
}
setup_step ip netns add "$ns0"
setup_step ip netns add "$ns1"
setup_step ip link add "$veth0" type veth peer name "$veth1"
setup_step ip link set "$veth0" netns "$ns0"
setup_step ip link set "$veth1" netns "$ns1"
setup_step ip -n "$ns0" addr add 10.77.0.1/24 dev "$veth0"
setup_step ip -n "$ns1" addr add 10.77.0.2/24 dev "$veth1"
for ns in "$ns0" "$ns1"; do setup_step ip -n "$ns" link set lo up; done
setup_step ip -n "$ns0" link set "$veth0" up
setup_step ip -n "$ns1" link set "$veth1" up
in_ns() { local ns=$1; shift; nsenter --net="/var/run/netns/$ns" "$@"; }
setup_step in_ns "$ns0" true

train=(--model net --dim 64 --steps 6 --batch-size 4 --timeout-s 60)
port=29731
# Node 1 first in the background, node 0 (rank 0: the store) in the foreground; both bounded.
GLOO_SOCKET_IFNAME=$veth1 timeout 120 nsenter --net="/var/run/netns/$ns1" "$ddp_run" --nnodes 2 --node-rank 1 \
  --nproc-per-node 1 --master-addr 10.77.0.1 --master-port $port -- \
  "$ddp_train" "${train[@]}" >"$work/node1.log" 2>&1 &
node1=$!
GLOO_SOCKET_IFNAME=$veth0 timeout 120 nsenter --net="/var/run/netns/$ns0" "$ddp_run" --nnodes 2 --node-rank 0 \
  --nproc-per-node 1 --master-addr 10.77.0.1 --master-port $port -- \
  "$ddp_train" "${train[@]}" --save-weights "$work/two-nodes.safetensors" >"$work/node0.log" 2>&1 ||
  { echo "node 0 failed:"; cat "$work/node0.log"; wait $node1 || true; cat "$work/node1.log"; exit 1; }
wait $node1 || { echo "node 1 failed:"; cat "$work/node1.log"; exit 1; }

timeout 120 "$ddp_run" --nproc-per-node 2 -- "$ddp_train" "${train[@]}" \
  --save-weights "$work/one-node.safetensors" >"$work/one-node.log" 2>&1 ||
  { echo "one-node run failed:"; cat "$work/one-node.log"; exit 1; }

grep -h "loss" "$work/node0.log" | tail -1
if cmp -s "$work/two-nodes.safetensors" "$work/one-node.safetensors"; then
  echo "two-node result equals the one-node result (bitwise)"
else
  echo "two-node and one-node parameters differ"; exit 1
fi
