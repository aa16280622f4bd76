"""Noise: at the same learning rate, async's loss is noisier than sync's.

Three paced workers train the seeds' y = 2x + 10 from the same start, sync
then async, for the same number of updates.  A sync update averages the three
workers' gradients; an async update is one worker's gradient, read a few
updates earlier.  Both start near the optimum, so what the loss shows is the
parameters' wander around it, not a descent.  The loss compared is the one
measure every mode shares: the held-out loss on the same 256 examples every
few updates (``History.evals``), after the first ``SETTLE`` updates.

What the ratio is, and what it is not: a sync update averages N gradients,
which divides their variance by N, so the standard deviation (what is
measured) by about sqrt(N) (1.7 for N = 3), before staleness adds any
noise.  So the claim mixes two causes.  A control separates them: async
again, with N times the batch per update (the examples a sync update uses),
so its gradients are as averaged as sync's and only their staleness
differs.  Its ratio to sync is reported beside the claim's; it is measured,
not judged (staleness's own share of the noise is small at this learning
rate and varies between seeds).
"""

from __future__ import annotations

import statistics

from ..plots import log_y
from .base import Check, Claim, Finding, Lab, figure

CLAIM = Claim(
    "Synchronous SGD's loss is stable; asynchronous SGD's is noisier (each update is one worker's "
    "stale gradient), at the same learning rate",
    "source article 001 (sync SGD: stable loss; async SGD: stale gradients, noisier loss)",
)

WORKERS = 3
UPDATES = 100
#: the first updates are left out: what is left after them is the wander around the optimum
SETTLE = 10
LR = 0.1
BATCH = 32  # per worker and update (tfmagic.train's default)


def settled(history) -> list[float]:
    """The held-out losses once the run has settled."""
    return [loss for step, _t, loss in history.evals if step > SETTLE]


def measure(lab: Lab) -> Finding:
    import numpy as np

    rng = np.random.default_rng(lab.seed)
    # both start from the same point near the optimum (w = 2, b = 10), so the loss has no long
    # descent whose trend would swamp the noise; what the held-out loss then shows is the wander
    start = [
        np.array([[2.0 + rng.normal(0, 0.05)]], np.float32),
        np.array([10.0 + rng.normal(0, 0.05)], np.float32),
    ]
    with lab.cluster(workers=WORKERS) as cluster:
        sync = lab.train(cluster, "sync", UPDATES, lr=LR, initial_weights=start)
        asyn = lab.train(cluster, "async", UPDATES, lr=LR, initial_weights=start)
        control = lab.train(
            cluster,
            "async",
            UPDATES,
            lr=LR,
            initial_weights=start,
            batch_size=BATCH * WORKERS,
            label=f"async, {WORKERS}x batch",
        )
    s, a, c = settled(sync), settled(asyn), settled(control)
    if len(s) < 4 or len(a) < 4:
        from ..errors import TrainingError

        raise TrainingError(f"too few held-out measurements to judge ({len(s)} sync, {len(a)} async)")
    sd_s, sd_a = statistics.stdev(s), statistics.stdev(a)
    sd_c = statistics.stdev(c) if len(c) >= 4 else float("nan")
    ratio = sd_a / sd_s
    measured = {
        "sync held-out loss sd": sd_s,
        "async held-out loss sd": sd_a,
        "async / sync sd": ratio,
        f"control: async with {WORKERS}x batch / sync sd": sd_c / sd_s,
        f"averaging alone would give sqrt({WORKERS})": WORKERS**0.5,
        "sync mean held-out loss": statistics.fmean(s),
        "async mean held-out loss": statistics.fmean(a),
        "measurements (sync, async)": (len(s), len(a)),
    }
    checks = [Check("async / sync sd", ratio, 1.2, ">=", "async's loss is noisier")]
    fig, (left, right) = figure()
    for h, color, label in (
        (sync, "#1f77b4", "sync"),
        (asyn, "#d62728", "async"),
        (control, "#ff9896", f"async, {WORKERS}x batch"),
    ):
        left.plot([e[0] for e in h.evals], [e[2] for e in h.evals], color=color, label=label)
    log_y(left, "held-out loss (256 examples)")
    left.set_xlabel("updates")
    left.legend(fontsize=8)
    steps_s = [e[0] for e in sync.evals if e[0] > SETTLE]
    steps_a = [e[0] for e in asyn.evals if e[0] > SETTLE]
    right.plot(steps_s, s, "o-", color="#1f77b4", label=f"sync, sd {sd_s:.2g}")
    right.plot(steps_a, a, "o-", color="#d62728", label=f"async, sd {sd_a:.2g}")
    right.set_xlabel(f"updates (after {SETTLE})")
    right.set_ylabel("held-out loss")
    right.set_title("raw, not smoothed")
    right.legend(fontsize=8)
    fig.tight_layout()
    return Finding(measured, checks, fig)
