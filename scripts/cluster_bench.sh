#!/usr/bin/env bash
# Runs kv_bench against a local cluster (docs/cluster.md): a private etcd and N kv_server
# members on 127.0.0.1, a kv_bench client with --cluster.
#   scripts/cluster_bench.sh BUILD_DIR MEMBERS REPLICAS [kv_bench flags...]
# e.g. scripts/cluster_bench.sh build 3 1 --benchmarks=vllm_write,vllm_get --num=1024
# KV_FAILOVER_MEMBER=N passes member N as --failover_member/--failover_pid (for the
# cluster_failover benchmark):
#   KV_FAILOVER_MEMBER=1 scripts/cluster_bench.sh build 3 2 \
#       --benchmarks=fillseq,cluster_failover --num=1024 --value_size=1048576
# KV_PEER_MEMBER=N passes member N as --peer (peer_put and peer_get then run against that
# one member, beside the cluster benchmarks: vllm_load's yardstick):
#   KV_PEER_MEMBER=1 scripts/cluster_bench.sh build 3 1 \
#       --benchmarks=vllm_write,peer_get,vllm_load_serial,vllm_load --num=1024 \
#       --value_size=65536 --num_layers=32 --batch_size=32
# KV_ATTACH_MEMBER=N runs kv_bench attached to member N (--attach=its --local_listen
# socket, docs/attach.md) instead of as a cluster client: an attached vLLM worker's view.
#   KV_ATTACH_MEMBER=1 KV_PEER_MEMBER=2 scripts/cluster_bench.sh build 3 1 \
#       --benchmarks=vllm_write,peer_get,vllm_load_serial,vllm_load --num=4096 \
#       --value_size=65536 --num_layers=32 --batch_size=32
# KV_JOIN=1 passes --join_command, which starts member N+1 (for the cluster_join
# benchmark):
#   KV_JOIN=1 scripts/cluster_bench.sh build 3 1 \
#       --benchmarks=fillseq,cluster_join --num=4096 --value_size=65536
set -euo pipefail
build=$1 members=$2 replicas=$3
shift 3
work=$(mktemp -d /tmp/kv_cluster_bench.XXXXXX)
pids=()
failover=()
peer=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  if [[ -f "$work/joined.pid" ]]; then kill -9 "$(cat "$work/joined.pid")" 2>/dev/null || true; fi
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

client_port=$(free_port) peer_port=$(free_port)
etcd --name=bench --data-dir="$work/etcd" \
  --listen-client-urls="http://127.0.0.1:$client_port" \
  --advertise-client-urls="http://127.0.0.1:$client_port" \
  --listen-peer-urls="http://127.0.0.1:$peer_port" \
  --initial-advertise-peer-urls="http://127.0.0.1:$peer_port" \
  --initial-cluster="bench=http://127.0.0.1:$peer_port" >"$work/etcd.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do
  curl -s -X POST "http://127.0.0.1:$client_port/v3/kv/range" -d '{"key":"AA=="}' >/dev/null && break
  sleep 0.1
done
cluster="etcd://127.0.0.1:$client_port/kvbench"
member_options="memory_capacity_bytes=${KV_MEMBER_MEMORY:-4GiB},prefault_memory=false,ssd_capacity_bytes=0,peer_mode=sharded,cluster_replicas=$replicas,log_level=error"
for m in $(seq "$members"); do
  port=$(free_port)
  "$build/kv_server" --db="$work/m$m" --listen="127.0.0.1:$port" --transport=tcp \
    --cluster="$cluster" --local_listen="$work/m$m.sock" --options="$member_options" \
    >"$work/m$m.out" 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do grep -q serving "$work/m$m.out" && break; sleep 0.1; done
  echo "member $m: pid ${pids[-1]} 127.0.0.1:$port" >&2
  if [[ "${KV_PEER_MEMBER:-}" == "$m" ]]; then
    peer=(--peer="127.0.0.1:$port")
  fi
  if [[ "${KV_FAILOVER_MEMBER:-}" == "$m" ]]; then
    failover=(--failover_member="127.0.0.1:$port" --failover_pid="${pids[-1]}")
  fi
done
join=()
if [[ -n "${KV_JOIN:-}" ]]; then
  # Member N+1, started by kv_bench's cluster_join once the cluster is filled.
  m=$((members + 1)) port=$(free_port)
  cat >"$work/join.sh" <<EOF
"$build/kv_server" --db="$work/m$m" --listen="127.0.0.1:$port" --transport=tcp \\
  --cluster="$cluster" --options="$member_options" >"$work/m$m.out" 2>&1 &
echo \$! >"$work/joined.pid"
for _ in \$(seq 100); do grep -q serving "$work/m$m.out" && exit 0; sleep 0.1; done
exit 1
EOF
  join=(--join_command="bash $work/join.sh")
fi
sleep 0.5  # the members see each other
if [[ -n "${KV_ATTACH_MEMBER:-}" ]]; then
  "$build/kv_bench" --attach="$work/m$KV_ATTACH_MEMBER.sock" "${peer[@]}" "$@"
  exit
fi
"$build/kv_bench" --cluster="$cluster" --options="cluster_replicas=$replicas,peer_transport=tcp" \
  "${failover[@]}" "${peer[@]}" "${join[@]}" "$@"
