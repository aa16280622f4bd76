"""Stragglers: one slow worker paces every sync update, and only itself in async.

Three paced workers; sync and async run unslowed, then with ``worker:2``'s
machine ``K`` times slower, on the same cluster.  Sync waits for every
gradient, so its update takes the slowed worker's time (about ``K`` times
longer); async workers never wait, so the other two keep their pace.
"""

from __future__ import annotations

from .base import Check, Claim, Finding, Lab, figure, worker_rates

CLAIM = Claim(
    "Synchronous training is paced by its slowest worker: a straggler slows every update; "
    "asynchronous workers do not wait for each other, so a straggler slows only itself",
    "source article 001 (sync SGD vs async SGD)",
)

K = 4
WORKERS = 3
SLOW = "worker:2"


def measure(lab: Lab) -> Finding:
    with lab.cluster(workers=WORKERS) as cluster:
        sync = lab.train(cluster, "sync", 20, label="sync, nobody slowed")
        fast = lab.train(cluster, "async", 60, label="async, nobody slowed")
        lab.progress(f"slowing {SLOW} x{K} (its modelled machine)")
        cluster.slow(SLOW, K)
        sync_slow = lab.train(cluster, "sync", 12, label=f"sync, {SLOW} x{K}")
        slow = lab.train(cluster, "async", 60, label=f"async, {SLOW} x{K}")
    step, step_slow = sync.median_step_time(), sync_slow.median_step_time()
    before, after = worker_rates(fast), worker_rates(slow)
    others = {t: after[t] / before[t] for t in before if t != SLOW}
    sync_ratio = step_slow / step
    keep = min(others.values())
    measured = {
        "k": K,
        "sync ms/update": step * 1000,
        f"sync ms/update, {SLOW} x{K}": step_slow * 1000,
        "sync step ratio": sync_ratio,
        "async others keep (min)": keep,
        f"async {SLOW} keeps": after[SLOW] / before[SLOW],
        "async total ratio": slow.updates_per_s() / fast.updates_per_s(),
    }
    checks = [
        Check("sync step ratio", sync_ratio, 0.75 * K, ">=", f"about k = {K}: the slowest worker paces sync"),
        Check("sync step ratio", sync_ratio, 1.25 * K, "<=", f"about k = {K}, not more"),
        Check("async others keep", keep, 0.9, ">=", "async workers do not wait for the straggler"),
    ]
    fig, (a, b) = figure()
    a.bar(["nobody slowed", f"{SLOW} x{K}"], [step * 1000, step_slow * 1000], color=["#1f77b4", "#ff7f0e"])
    a.set_ylabel("ms per sync update")
    a.set_title(f"sync: {sync_ratio:.2f}x slower")
    tasks = sorted(before)
    xs = range(len(tasks))
    b.bar([x - 0.2 for x in xs], [before[t] for t in tasks], 0.4, label="nobody slowed")
    b.bar([x + 0.2 for x in xs], [after[t] for t in tasks], 0.4, label=f"{SLOW} x{K}")
    b.set_xticks(list(xs), tasks)
    b.set_ylabel("async steps/s")
    b.set_title("async: each worker at its own pace")
    b.legend(fontsize=8)
    fig.tight_layout()
    return Finding(measured, checks, fig)
