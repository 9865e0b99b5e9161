#!/usr/bin/env bash
# `make run`: start an edge and a local node from configs/, stream one sample
# run through them, then keep serving until Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p tmp
edge_pid="" node_pid=""
cleanup() {
  trap - INT TERM EXIT
  [ -n "$node_pid" ] && kill "$node_pid" 2>/dev/null || true
  [ -n "$edge_pid" ] && kill "$edge_pid" 2>/dev/null || true
  wait 2>/dev/null || true
}
trap cleanup INT TERM EXIT

# The node trusts the edge by its CA's public key; auto TLS mode creates the
# CA in configs/edge-state/ on first use.
ca_pin=$(./bin/iop-edge --config configs/edge.yaml --print-ca-pin)
./bin/iop-edge --config configs/edge.yaml &
edge_pid=$!
export IOP_EDGE=http://127.0.0.1:7701
for _ in $(seq 1 50); do
  ./bin/iop nodes >/dev/null 2>&1 && break
  kill -0 "$edge_pid" 2>/dev/null || { echo "iop-edge failed to start (is port 7700/7701 busy?)" >&2; exit 1; }
  sleep 0.1
done

IOP_NODE_TOKEN=dev-token-change-me ./bin/iop-node --config configs/node.yaml --ca-pin "$ca_pin" &
node_pid=$!
for _ in $(seq 1 50); do
  ./bin/iop nodes 2>/dev/null | grep -qE '^local +online' && break
  kill -0 "$node_pid" 2>/dev/null || { echo "iop-node failed to start" >&2; exit 1; }
  sleep 0.1
done

echo
echo "== iop nodes"
./bin/iop nodes
echo
echo "== iop run --adapter exec --target count   (streams as the node's process prints)"
./bin/iop run --adapter exec --target count
echo
echo "== echo hello iop | iop run --adapter exec --target upper"
echo "hello iop" | ./bin/iop run --adapter exec --target upper -
echo
echo "Edge HTTP API on $IOP_EDGE, node transport (TLS, pin $ca_pin) on 127.0.0.1:7700. Try:"
echo "  IOP_EDGE=$IOP_EDGE ./bin/iop events        # live event bus"
echo "  ./bin/iop run --adapter exec --target count"
echo "  curl -N -X POST $IOP_EDGE/v1/runs -d '{\"adapter\":\"exec\",\"target\":\"count\"}'"
echo "Serving until Ctrl-C."
wait
