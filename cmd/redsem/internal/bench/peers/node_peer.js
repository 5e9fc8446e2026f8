'use strict';
// node redis-semaphore 5.8 (on one ioredis 5 connection), driven by the peers.sh workload.
//
// usage: node node_peer.js PORT LIMIT WORKERS HOLD_MS DURATION_S RETRY_MS
//   (NODE_PATH must lead to node_modules holding redis-semaphore and ioredis)
//
// WORKERS async loops acquire (a new Semaphore each time, retryInterval RETRY_MS), hold HOLD_MS,
// release until DURATION_S has passed; then one JSON line goes to stdout with the same fields as
// sortedset_peer.py: impl, holds, holds_per_s, utilization, mean_hold_ms, ideal_fifo_wait_ms,
// wait_p50_ms, wait_p99_ms, cmds_per_hold, redis_cpu_us_per_hold, jain, max_overlap, limit.
const { Semaphore } = require('redis-semaphore');
const Redis = require('ioredis');

const args = process.argv.slice(2).map(Number);
if (args.length !== 6 || args.some(Number.isNaN)) {
  console.error('usage: node node_peer.js PORT LIMIT WORKERS HOLD_MS DURATION_S RETRY_MS');
  process.exit(2);
}
const [port, limit, workers, holdMs, durationS, retryMs] = args;

const seconds = () => Number(process.hrtime.bigint()) / 1e9;
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const round = (x, digits) => Number(x.toFixed(digits));

// INFO text to an object of its "field:value" lines.
function parseInfo(text) {
  const fields = {};
  for (const line of text.split(/\r?\n/)) {
    const at = line.indexOf(':');
    if (at > 0 && !line.startsWith('#')) fields[line.slice(0, at)] = line.slice(at + 1);
  }
  return fields;
}

// Commands processed and Redis CPU seconds so far.
async function serverCounters(client) {
  const stats = parseInfo(await client.info('stats'));
  const cpu = parseInfo(await client.info('cpu'));
  return {
    commands: Number(stats.total_commands_processed),
    cpuS: Number(cpu.used_cpu_sys) + Number(cpu.used_cpu_user),
  };
}

async function main() {
  const client = new Redis({ host: '127.0.0.1', port });
  const name = 'bench-' + Math.random().toString(16).slice(2, 10);
  const tally = { inUse: 0, peak: 0, heldS: 0, waitsMs: [], perWorker: new Array(workers).fill(0) };
  const stopAt = seconds() + durationS;

  async function work(worker) {
    while (seconds() < stopAt) {
      const sem = new Semaphore(client, name, limit, {
        acquireTimeout: 60000,
        retryInterval: retryMs,
        lockTimeout: 30000,
        refreshInterval: 0,
      });
      const asked = seconds();
      await sem.acquire();
      const got = seconds();
      tally.waitsMs.push((got - asked) * 1000);
      tally.inUse++;
      tally.peak = Math.max(tally.peak, tally.inUse);
      if (holdMs > 0) await sleep(holdMs);
      tally.inUse--;
      tally.heldS += seconds() - got;
      await sem.release();
      tally.perWorker[worker]++;
    }
  }

  const before = await serverCounters(client);
  const began = seconds();
  await Promise.all(Array.from({ length: workers }, (_, i) => work(i)));
  const elapsed = seconds() - began;
  const after = await serverCounters(client);
  await client.quit();

  const holds = tally.perWorker.reduce((a, n) => a + n, 0);
  const perHold = Math.max(holds, 1);
  const meanHoldS = tally.heldS / perHold;
  const waits = tally.waitsMs.sort((a, b) => a - b);
  const quantile = (q) => (waits.length ? round(waits[Math.min(waits.length - 1, Math.floor(q * waits.length))], 2) : null);
  const squares = tally.perWorker.reduce((a, n) => a + n * n, 0);
  console.log(JSON.stringify({
    impl: `node-redis-semaphore(retry=${retryMs}ms)`,
    holds,
    holds_per_s: round(holds / elapsed, 1),
    utilization: holdMs > 0 ? round(tally.heldS / (limit * elapsed), 3) : null,
    mean_hold_ms: round(meanHoldS * 1000, 3),
    ideal_fifo_wait_ms: round(((workers - limit) / limit) * meanHoldS * 1000, 2),
    wait_p50_ms: quantile(0.5),
    wait_p99_ms: quantile(0.99),
    cmds_per_hold: round((after.commands - before.commands) / perHold, 2),
    redis_cpu_us_per_hold: round(((after.cpuS - before.cpuS) * 1e6) / perHold, 1),
    jain: squares ? round((holds * holds) / (workers * squares), 3) : 0,
    max_overlap: tally.peak,
    limit,
  }));
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
