#!/usr/bin/env bash
# Peer comparison: the sorted-set baseline (Python), node redis-semaphore 5.8 and
# `redsem bench` (fair, unfair; local too when contended, the floor when uncontended), alternating on one
# throw-away redis-server, then a table of medians as ratios to node. See
# README.md in this directory. Not part of CI.
#
# usage (from the repository root):
#   cmd/redsem/internal/bench/peers/peers.sh [contended|uncontended] [ROUNDS]
#     contended    limit 5, 50 workers, 2 ms holds, 5 s per run (the default)
#     uncontended  limit 10, 1 worker, no hold, 3 s per run
#     ROUNDS       how many times each implementation runs (default 3)
#   PIN=1 runs redis-server on CPU 0 and every client on CPU 1 (taskset).
set -euo pipefail

die() { echo "peers: $*" >&2; exit 1; }
usage() { sed -n '7,12p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

mode=${1:-contended}
rounds=${2:-3}
[[ $mode == contended || $mode == uncontended ]] || usage
[[ $rounds =~ ^[1-9][0-9]*$ ]] || usage
(( $# <= 2 )) || usage

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../../../../.." && pwd)
[[ -f $root/go.mod && -d $root/cmd/redsem ]] || die "cannot find the repository root from $here"

# The workload. redsem bench needs a hold: uncontended it holds 1 µs (a
# sub-millisecond hold spins, so its calls run back to back like the peers'),
# and the table shows its own TryAcquire+Release cycles/s instead of holds/s.
if [[ $mode == contended ]]; then
  limit=5 workers=50 hold_ms=2 secs=5 redsem_hold=2ms variants="fair unfair local"
else
  limit=10 workers=1 hold_ms=0 secs=3 redsem_hold=1us variants="fair unfair floor"
fi
py_retry_s=0.1 node_retry_ms=10

# --- what it needs -----------------------------------------------------------
for tool in redis-server redis-cli go node npm; do
  command -v "$tool" >/dev/null 2>&1 || die "needs $tool on PATH"
done
server_cpu=() client_cpu=()
if [[ ${PIN:-0} == 1 ]]; then
  command -v taskset >/dev/null 2>&1 || die "PIN=1 needs taskset (util-linux)"
  server_cpu=(taskset -c 0) client_cpu=(taskset -c 1)
fi

# The Python baseline uses redis-py; the system python3 gets it from apt.
py=/usr/bin/python3
[[ -x $py ]] || py=$(command -v python3) || die "needs python3"
if ! "$py" -c 'import redis' 2>/dev/null; then
  echo "peers: installing python3-redis with apt-get" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq python3-redis >/dev/null 2>&1 ||
    { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq python3-redis >/dev/null 2>&1; } || true
  "$py" -c 'import redis' 2>/dev/null || die "$py cannot import redis: install python3-redis (apt) or redis-py"
fi

# node redis-semaphore and ioredis, once, in a cache directory (not the repository).
node_dir=${XDG_CACHE_HOME:-$HOME/.cache}/redsem-bench-peers-node
node_ready() {
  [[ -d $node_dir/node_modules/ioredis ]] &&
    [[ $(node -p 'require(process.argv[1]).version' "$node_dir/node_modules/redis-semaphore/package.json" 2>/dev/null) == 5.8.0 ]]
}
if ! node_ready; then
  echo "peers: installing redis-semaphore@5.8.0 and ioredis@5 into $node_dir" >&2
  mkdir -p "$node_dir"
  npm install --silent --no-audit --no-fund --prefix "$node_dir" redis-semaphore@5.8.0 ioredis@5 >/dev/null ||
    die "npm install failed"
  node_ready || die "redis-semaphore 5.8.0 is not in $node_dir after npm install"
fi

# --- a throw-away redis-server on a free port, gone on exit -------------------
work=$(mktemp -d "${TMPDIR:-/tmp}/redsem-peers.XXXXXX")
port='' redis_pid=''
cleanup() {
  if [[ -n $redis_pid ]]; then
    redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
    for _ in $(seq 50); do kill -0 "$redis_pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$redis_pid" 2>/dev/null || true
    wait "$redis_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# A port the kernel hands out as free, never a well-known one (6379, 5432).
port=$("$py" - <<'PY'
import socket
while True:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        p = s.getsockname()[1]
    if p not in (6379, 5432):
        print(p)
        break
PY
)
"${server_cpu[@]}" redis-server --bind 127.0.0.1 --port "$port" --save '' --appendonly no \
  --dir "$work" --logfile "$work/redis.log" &
redis_pid=$!
for _ in $(seq 100); do
  [[ $(redis-cli -p "$port" ping 2>/dev/null) == PONG ]] && break
  kill -0 "$redis_pid" 2>/dev/null || die "redis-server did not start: $(tail -n 5 "$work/redis.log" 2>/dev/null)"
  sleep 0.05
done
[[ $(redis-cli -p "$port" ping 2>/dev/null) == PONG ]] || die "redis-server on port $port does not answer"
echo "peers: $mode, $rounds round(s), redis-server $(redis-server --version | grep -o 'v=[^ ]*') on 127.0.0.1:$port, PIN=${PIN:-0}" >&2

echo "peers: building redsem" >&2
(cd "$root" && go build -o "$work/redsem" ./cmd/redsem) || die "go build ./cmd/redsem failed"

# --- the runs ------------------------------------------------------------------
# "calls usec" of every EVAL*/FCALL* command so far (INFO commandstats).
script_totals() {
  redis-cli -p "$port" info commandstats | tr -d '\r' | awk -F'[:,=]' '
    /^cmdstat_(eval|fcall)/ { for (i = 2; i < NF; i += 2) { if ($i == "calls") c += $(i+1); if ($i == "usec") u += $(i+1) } }
    END { printf "%d %d\n", c, u }'
}

# measure CMD...: runs CMD on the clients' CPU and prints its JSON lines, each
# with the script calls and time Redis counted while it ran.
measure() {
  local c0 u0 c1 u1 out
  read -r c0 u0 < <(script_totals)
  if ! out=$("${client_cpu[@]}" "$@" 2>"$work/stderr"); then
    echo "peers: failed: $*" >&2; tail -n 20 "$work/stderr" >&2; return 0
  fi
  read -r c1 u1 < <(script_totals)
  if ! grep -q '^{' <<<"$out"; then
    echo "peers: no result from: $*" >&2; tail -n 20 "$work/stderr" >&2; return 0
  fi
  grep '^{' <<<"$out" | sed "s/^{/{\"script_calls\": $((c1 - c0)), \"script_usec\": $((u1 - u0)), /"
}

for ((round = 1; round <= rounds; round++)); do
  echo "peers: round $round of $rounds" >&2
  measure "$py" "$here/sortedset_peer.py" "$port" "$limit" "$workers" "$hold_ms" "$secs" "$py_retry_s"
  measure env NODE_PATH="$node_dir/node_modules" node "$here/node_peer.js" \
    "$port" "$limit" "$workers" "$hold_ms" "$secs" "$node_retry_ms"
  for variant in $variants; do
    measure "$work/redsem" bench -redis "redis://127.0.0.1:$port" -variant "$variant" -limit "$limit" \
      -workers "$workers" -hold "$redsem_hold" -duration "${secs}s" -json -quiet
  done
done | tee "$work/runs.jsonl"

"$py" "$here/summary.py" "$mode" "$work/runs.jsonl"
