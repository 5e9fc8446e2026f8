#!/usr/bin/env python3
"""The sorted-set baseline (Python), driven by the peers.sh workload.

The baseline is the semaphore most write first. It follows the algorithm of
the textbook lesson on distributed semaphores (its DistributedSemaphore class
and acquire script), in code of our own: one sorted set per semaphore, a
member per holder (a fresh UUID per acquire) scored with the client's clock in
ms. One Lua script drops the members older than the lease (by the caller's
clock), counts the rest (ZCARD) and, when the count is under the limit, adds
the caller (ZADD) and sets the key to expire a second after the lease; release
is a ZREM of the holder. A refused acquire sleeps RETRY_S (the lesson's retry
interval is 100 ms) and tries again.

usage: sortedset_peer.py PORT LIMIT WORKERS HOLD_MS DURATION_S RETRY_S

WORKERS threads loop acquire, hold HOLD_MS, release until DURATION_S has
passed, then one JSON line goes to stdout with: impl, holds, holds_per_s,
utilization, mean_hold_ms, ideal_fifo_wait_ms, wait_p50_ms, wait_p99_ms,
cmds_per_hold, redis_cpu_us_per_hold, jain, max_overlap, limit.
"""
import json
import sys
import threading
import time
import uuid

import redis

# KEYS[1]: the holders. ARGV: now (client clock, ms), lease (ms), limit, holder id.
ACQUIRE_SCRIPT = """
local now = tonumber(ARGV[1])
local lease = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - lease)
if redis.call('ZCARD', KEYS[1]) >= limit then
  return 0
end
redis.call('ZADD', KEYS[1], now, ARGV[4])
redis.call('EXPIRE', KEYS[1], math.ceil(lease / 1000) + 1)
return 1
"""

RELEASE_SCRIPT = "return redis.call('ZREM', KEYS[1], ARGV[1])"


class SortedSetSemaphore:
    """The baseline: a sorted set of holders, the client's clock, polling."""

    def __init__(self, client, name, limit, lease_s=30.0):
        self.key = "sem:" + name
        self.limit = limit
        self.lease_ms = int(lease_s * 1000)
        self._acquire = client.register_script(ACQUIRE_SCRIPT)
        self._release = client.register_script(RELEASE_SCRIPT)

    def try_acquire(self):
        """One attempt: the holder id when a slot was free, else None."""
        holder = uuid.uuid4().hex
        now_ms = int(time.time() * 1000)
        granted = self._acquire(keys=[self.key], args=[now_ms, self.lease_ms, self.limit, holder])
        return holder if granted == 1 else None

    def acquire(self, retry_s, give_up_at):
        """Polls every retry_s until granted; None once give_up_at (monotonic) has passed."""
        while True:
            holder = self.try_acquire()
            if holder is not None:
                return holder
            if time.monotonic() >= give_up_at:
                return None
            time.sleep(retry_s)

    def release(self, holder):
        self._release(keys=[self.key], args=[holder])


class Tally:
    """What the workers observed, under one lock."""

    def __init__(self, workers):
        self.lock = threading.Lock()
        self.in_use = 0
        self.peak = 0
        self.held_s = 0.0
        self.waits_s = []
        self.per_worker = [0] * workers

    def granted(self, wait_s):
        with self.lock:
            self.in_use += 1
            self.peak = max(self.peak, self.in_use)
            self.waits_s.append(wait_s)

    def released(self, worker, held_s):
        with self.lock:
            self.in_use -= 1
            self.held_s += held_s
            self.per_worker[worker] += 1


def server_counters(client):
    """(commands processed, Redis CPU seconds) so far."""
    stats, cpu = client.info("stats"), client.info("cpu")
    return stats["total_commands_processed"], cpu["used_cpu_sys"] + cpu["used_cpu_user"]


def quantile_ms(sorted_s, q):
    if not sorted_s:
        return None
    return round(sorted_s[min(len(sorted_s) - 1, int(q * len(sorted_s)))] * 1000, 2)


def main(argv):
    if len(argv) != 7:
        sys.exit(__doc__)
    port, limit, workers = int(argv[1]), int(argv[2]), int(argv[3])
    hold_ms, duration_s, retry_s = float(argv[4]), float(argv[5]), float(argv[6])

    pool = redis.ConnectionPool(host="127.0.0.1", port=port, max_connections=workers + 4)
    client = redis.Redis(connection_pool=pool)
    sem = SortedSetSemaphore(client, "bench-" + uuid.uuid4().hex[:8], limit)
    tally = Tally(workers)
    stop_at = time.monotonic() + duration_s

    def work(worker):
        while time.monotonic() < stop_at:
            asked = time.monotonic()
            holder = sem.acquire(retry_s, give_up_at=stop_at + 5)
            if holder is None:
                return
            got = time.monotonic()
            tally.granted(got - asked)
            if hold_ms > 0:
                time.sleep(hold_ms / 1000)
            tally.released(worker, time.monotonic() - got)
            sem.release(holder)

    cmds0, cpu0 = server_counters(client)
    began = time.monotonic()
    threads = [threading.Thread(target=work, args=(i,)) for i in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - began
    cmds1, cpu1 = server_counters(client)

    holds = sum(tally.per_worker)
    per_hold = max(holds, 1)
    mean_hold_s = tally.held_s / per_hold
    waits = sorted(tally.waits_s)
    squares = sum(n * n for n in tally.per_worker)
    print(json.dumps({
        "impl": "sorted-set-python(retry=%gs)" % retry_s,
        "holds": holds,
        "holds_per_s": round(holds / elapsed, 1),
        "utilization": round(tally.held_s / (limit * elapsed), 3) if hold_ms > 0 else None,
        "mean_hold_ms": round(mean_hold_s * 1000, 3),
        "ideal_fifo_wait_ms": round((workers - limit) / limit * mean_hold_s * 1000, 2),
        "wait_p50_ms": quantile_ms(waits, 0.50),
        "wait_p99_ms": quantile_ms(waits, 0.99),
        "cmds_per_hold": round((cmds1 - cmds0) / per_hold, 2),
        "redis_cpu_us_per_hold": round((cpu1 - cpu0) * 1e6 / per_hold, 1),
        "jain": round(holds * holds / (workers * squares), 3) if squares else 0,
        "max_overlap": tally.peak,
        "limit": limit,
    }))


if __name__ == "__main__":
    main(sys.argv)
