"""Backup workers: aggregate the first N of N + b gradients, and a straggler no longer sets the pace.

Three paced workers, sync with one backup (the first 2 of 3 gradients make
each update, the last is dropped).  Measured on one cluster: sync's update
time with nobody slowed (all 3 gradients, and 2 of 3), then with
``worker:2``'s machine ``K`` times slower, with the backup and without it
(the contrast: plain sync waits for the straggler).  The claim is that the
backup gives sync back the pace it had before the straggler came.
"""

from __future__ import annotations

from .base import Check, Claim, Finding, Lab, figure

CLAIM = Claim(
    "Synchronous SGD with b backup workers (apply the first N of N + b gradients, drop the rest) "
    "is not held up by stragglers: it keeps the pace it has without them",
    'Chen, Pan, Monga, Bengio, Jozefowicz, "Revisiting Distributed Synchronous SGD", 2016 (arXiv:1604.00981)',
)

K = 4
WORKERS = 3
SLOW = "worker:2"


def measure(lab: Lab) -> Finding:
    with lab.cluster(workers=WORKERS) as cluster:
        plain_base = lab.train(cluster, "sync", 20, label="sync, 3 of 3, nobody slowed")
        base = lab.train(cluster, "sync", 15, label="sync, 2 of 3, nobody slowed", backup_workers=1)
        lab.progress(f"slowing {SLOW} x{K} (its modelled machine)")
        cluster.slow(SLOW, K)
        backup = lab.train(cluster, "sync", 20, label=f"sync, 2 of 3, {SLOW} x{K}", backup_workers=1)
        plain = lab.train(cluster, "sync", 10, label=f"sync, 3 of 3, {SLOW} x{K}")
    t_sync, t_base, t_backup, t_plain = (h.median_step_time() for h in (plain_base, base, backup, plain))
    dropped = backup.dropped()
    ratio, plain_ratio = t_backup / t_sync, t_plain / t_sync
    measured = {
        "k": K,
        "3 of 3, nobody slowed (ms/update)": t_sync * 1000,
        "2 of 3, nobody slowed (ms/update)": t_base * 1000,
        f"2 of 3, {SLOW} x{K} (ms/update)": t_backup * 1000,
        f"3 of 3, {SLOW} x{K} (ms/update)": t_plain * 1000,
        "backup pace ratio": ratio,
        "no-backup pace ratio": plain_ratio,
        "2 of 3: straggler / none": t_backup / t_base,
        f"{SLOW}'s gradients dropped": dropped.get(SLOW, 0),
    }
    checks = [
        Check(
            "backup pace ratio", ratio, 1.10, "<=", "2 of 3 with the straggler keeps sync's pace without it"
        ),
        Check("no-backup pace ratio", plain_ratio, 0.6 * K, ">=", "without one, the straggler paces sync"),
    ]
    fig, (a, b) = figure()
    labels = [
        "3 of 3\nnobody slowed",
        "2 of 3\nnobody slowed",
        f"2 of 3\n{SLOW} x{K}",
        f"3 of 3\n{SLOW} x{K}",
    ]
    a.bar(
        labels,
        [t_sync * 1000, t_base * 1000, t_backup * 1000, t_plain * 1000],
        color=["#7f7f7f", "#1f77b4", "#2ca02c", "#d62728"],
    )
    a.set_ylabel("ms per sync update (median)")
    a.tick_params(axis="x", labelsize=8)  # four two-line names side by side
    a.set_title("the backup absorbs the straggler")
    for h, name, color in (
        (base, "2 of 3, nobody slowed", "#1f77b4"),
        (backup, f"2 of 3, {SLOW} x{K}", "#2ca02c"),
    ):
        g = h.global_steps
        b.plot([x.time - g[0].time for x in g], [x.step for x in g], label=name, color=color)
    g = plain.global_steps
    b.plot(
        [x.time - g[0].time for x in g], [x.step for x in g], label=f"3 of 3, {SLOW} x{K}", color="#d62728"
    )
    b.set_xlabel("seconds")
    b.set_ylabel("updates")
    b.legend(fontsize=8)
    fig.tight_layout()
    return Finding(measured, checks, fig)
