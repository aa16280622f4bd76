"""Noise: at the same learning rate, async's loss is noisier than sync's.

Three paced workers train the seeds' y = 2x + 10 from the same start, sync
then async, for the same number of updates.  A sync update averages the three
workers' gradients; an async update is one worker's gradient, read a few
updates earlier.  The loss compared is the one measure every mode shares: the
held-out loss on the same 256 examples every few updates (``History.evals``),
once training has levelled off (the second half of each run), where what is
left is the parameters' jitter around the optimum.
"""

from __future__ import annotations

import statistics

from .base import Check, Claim, Finding, Lab, figure

CLAIM = Claim(
    "Synchronous SGD's loss is stable; asynchronous SGD's is noisier (each update is one worker's "
    "stale gradient), at the same learning rate",
    "seed article 001 (sync SGD: stable loss; async SGD: stale gradients, noisier loss)",
)

WORKERS = 3
UPDATES = 160
LR = 0.1


def settled(history) -> list[float]:
    """The held-out losses of the run's second half."""
    evals = history.evals
    return [loss for step, _t, loss in evals if step > UPDATES // 2]


def measure(lab: Lab) -> Finding:
    with lab.cluster(workers=WORKERS) as cluster:
        sync = lab.train(cluster, "sync", UPDATES, lr=LR)
        asyn = lab.train(cluster, "async", UPDATES, lr=LR)
    s, a = settled(sync), settled(asyn)
    if len(s) < 4 or len(a) < 4:
        from ..errors import TrainingError

        raise TrainingError(f"too few held-out measurements to judge ({len(s)} sync, {len(a)} async)")
    sd_s, sd_a = statistics.stdev(s), statistics.stdev(a)
    ratio = sd_a / sd_s
    measured = {
        "sync held-out loss sd": sd_s,
        "async held-out loss sd": sd_a,
        "async / sync sd": ratio,
        "sync mean held-out loss": statistics.fmean(s),
        "async mean held-out loss": statistics.fmean(a),
        "measurements (sync, async)": (len(s), len(a)),
    }
    checks = [Check("async / sync sd", ratio, 1.2, ">=", "async's loss is noisier")]
    fig, (left, right) = figure()
    for h, color in ((sync, "#1f77b4"), (asyn, "#d62728")):
        left.plot([e[0] for e in h.evals], [e[2] for e in h.evals], color=color, label=h.mode)
    left.set_yscale("log")
    left.set_xlabel("updates")
    left.set_ylabel("held-out loss (256 examples)")
    left.legend(fontsize=8)
    steps_s = [e[0] for e in sync.evals if e[0] > UPDATES // 2]
    steps_a = [e[0] for e in asyn.evals if e[0] > UPDATES // 2]
    right.plot(steps_s, s, "o-", color="#1f77b4", label=f"sync, sd {sd_s:.2g}")
    right.plot(steps_a, a, "o-", color="#d62728", label=f"async, sd {sd_a:.2g}")
    right.set_xlabel("updates (second half)")
    right.set_title("raw, not smoothed")
    right.legend(fontsize=8)
    fig.tight_layout()
    return Finding(measured, checks, fig)
