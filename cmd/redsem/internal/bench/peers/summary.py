#!/usr/bin/env python3
"""The table peers.sh prints: per implementation, the median of its runs, each
figure followed by its ratio to node redis-semaphore's median in the same
invocation.

usage: summary.py contended|uncontended RUNS.jsonl

RUNS.jsonl holds one JSON object per run: the line a driver (sortedset_peer.py,
node_peer.js) or `redsem bench -json` printed, with two fields that peers.sh
adds: script_calls and script_usec, the EVAL*/FCALL* calls and their time from
INFO commandstats, taken just before and just after the run.
"""
import json
import os
import statistics
import sys

COLUMNS = ["holds/s", "hold ms", "gap ms", "util", "p99/ideal", "jain", "redis cmds/hold", "redis CPU us/hold", "us/script"]
NODE = "node redis-semaphore 5.8"


def retry_of(impl):
    """'x(retry=0.1s)' -> '100 ms retry'."""
    inner = impl[impl.find("retry=") + 6:].rstrip(")")
    if inner.endswith("ms"):
        return f"{float(inner[:-2]):g} ms retry"
    if inner.endswith("s"):
        return f"{float(inner[:-1]) * 1000:g} ms retry"
    return inner + " retry"


def label(run):
    impl = run.get("impl")
    if impl is None:
        if run["variant"] == "floor":
            return "floor scripts on go-redis (no redsem)"
        return "redsem " + run["variant"]
    if impl.startswith("sorted-set"):
        return f"sorted-set baseline (Python, {retry_of(impl)})"
    if impl.startswith("node"):
        return f"{NODE} ({retry_of(impl)})"
    return impl


def figures(run, mode):
    """One run's figures, None where a figure does not apply."""
    redsem = "impl" not in run
    rate = run["holds_per_s"]
    if mode == "uncontended" and redsem and run.get("uncontended_cycles_per_s"):
        # Its own TryAcquire+Release loop: no hold, like the peers' loops.
        rate = run["uncontended_cycles_per_s"]
    util = run.get("utilisation" if redsem else "utilization") if mode == "contended" else None
    ideal = run.get("ideal_wait_ms" if redsem else "ideal_fifo_wait_ms") or 0
    p99 = run.get("wait_p99_ms")
    calls, usec = run.get("script_calls") or 0, run.get("script_usec") or 0
    # Contended: how long the holds really lasted (the drivers sleep as
    # precisely as their runtimes let them), and the gap, each slot's time
    # per hold between one holder and the next: limit / holds/s - hold.
    # Holds/s compare only between runs whose holds lasted alike; the gap
    # compares the semaphores whatever the holds.
    hold = run.get("mean_hold_ms") if mode == "contended" else None
    gap = None
    if hold is not None and rate > 0 and run.get("limit"):
        gap = run["limit"] / rate * 1000 - hold
    return {
        "holds/s": rate,
        "hold ms": hold,
        "gap ms": gap,
        "util": util,
        "p99/ideal": p99 / ideal if p99 is not None and ideal > 0 else None,
        "jain": run.get("jain"),
        "redis cmds/hold": run.get("redis_calls_per_hold" if redsem else "cmds_per_hold"),
        "redis CPU us/hold": run.get("redis_cpu_us_per_hold"),
        "us/script": usec / calls if calls > 0 else None,
    }


def number(v):
    return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"


def main(argv):
    if len(argv) != 3 or argv[1] not in ("contended", "uncontended"):
        sys.exit(__doc__)
    mode = argv[1]
    by_impl, errors = {}, {}
    with open(argv[2]) as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            run = json.loads(line)
            name = label(run)
            by_impl.setdefault(name, []).append(figures(run, mode))
            if run.get("errors"):
                errors[name] = errors.get(name, 0) + run["errors"]
    if not by_impl:
        sys.exit("peers: no run printed a result")

    def median(name, col):
        vals = [r[col] for r in by_impl.get(name, []) if r[col] is not None]
        return statistics.median(vals) if vals else None

    node = next((n for n in by_impl if n.startswith(NODE)), None)
    rows = []
    for name in by_impl:
        cells = []
        for col in COLUMNS:
            v = median(name, col)
            base = median(node, col) if node and name != node else None
            if v is None:
                cells.append("-")
            elif base:
                cells.append(f"{number(v)} ({v / base:.2f}x)")
            else:
                cells.append(number(v))
        rows.append([name] + cells)

    header = ["impl"] + COLUMNS
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(len(header))]
    n_runs = max(len(v) for v in by_impl.values())
    pinned = "redis-server on CPU 0, clients on CPU 1" if os.environ.get("PIN") == "1" else "not pinned"
    print()
    print(f"{mode}: median of {n_runs} alternating run(s) each ({pinned}); (x) = ratio to node's median")
    print("  ".join(h.ljust(widths[0]) if i == 0 else h.rjust(widths[i]) for i, h in enumerate(header)))
    for r in rows:
        print("  ".join(c.ljust(widths[0]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(r)))
    if mode == "uncontended":
        print("redsem's holds/s here is its uncontended TryAcquire+Release cycles/s (uncontended_cycles_per_s);")
        print("the floor's, its worker's acquire, 1 us hold, release loop.")
    for name, n in errors.items():
        print(f"warning: {name}: {n} errors during its runs (see the JSON lines above)")


if __name__ == "__main__":
    main(sys.argv)
