"""Why paced async staleness spreads around workers - 1: three paced workers, 300 updates, several runs.

Lesson 02 says the mean staleness over all gradients is near 2 for three workers and checks it
between 1.6 and 2.4; its committed run measured 1.65, and a loaded clean-clone run 1.49. The spread
comes from ties: a step's real call (apply the gradient, read the parameters again) takes a few
milliseconds, and three workers' steps end only pace / 3 apart, so two calls that overlap land in
either order. Each run prints the mean, the histogram (staleness: gradients), and the share of steps
that took over 1.25 times their modelled time (what the run's own pace check counts).

``--variant`` tries two changes of the paced async loop beside the engine as it is (monkeypatched
here, not in tfmagic): ``catchup`` starts a step at the previous modelled end after any hold-up
shorter than one pace (the engine absorbs 50 ms), ``stagger`` starts worker i i/3 of a pace late.
Measured on 2026-12-02 (2 cores, 60 ms pace, three runs each): the engine 1.72, 1.87, 1.84; catchup
1.84, 1.67, 1.84; stagger 1.96, 1.67, 1.96; both 1.91, 1.95, 1.89, 1.72, 1.95; beside a busy loop
(70 % of a core) the engine 1.85, 1.84, 1.90 and both 1.87, 1.63, 1.95. Neither holds the spike:
not adopted.

    python bench/staleness_spread.py [--runs 3] [--pace 60ms] [--variant engine|catchup|stagger|both]
"""

from __future__ import annotations

import argparse
import collections
import time

import tfmagic
from tfmagic.training import asynchronous


def _patch(variant: str) -> None:
    loop = asynchronous.AsyncLoop
    if variant in ("catchup", "both"):

        def start_time(self, unread):
            now = time.time()
            limit = max(asynchronous.CARRY, self.pace.base if self.pace else 0.0)
            if unread.ended is not None and 0 <= now - unread.ended < limit:
                return unread.ended
            return now

        loop.start_time = start_time
    if variant in ("stagger", "both"):
        step = loop.step

        def staggered(self, w):
            if self.pace is not None and not w.started and not getattr(w, "_staggered", False):
                w._staggered = True
                time.sleep(w.task.index * self.pace.base / 3)
            return step(self, w)

        loop.step = staggered


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--pace", default="60ms")
    parser.add_argument("--variant", choices=("engine", "catchup", "stagger", "both"), default="engine")
    args = parser.parse_args()
    _patch(args.variant)
    with tfmagic.LocalCluster(ps=1, workers=3, spares=False, pace=args.pace) as cluster:
        for _ in range(args.runs):
            h = tfmagic.train(cluster, mode="async", model="digits", steps=300, lr=0.1, batch_size=32)
            recs = [r for r in h.records if not r.warmup]
            counts = collections.Counter(r.staleness for r in recs)
            missed = sum(1 for r in recs if r.paced and r.duration > r.paced * 1.25) / len(recs)
            mean = sum(r.staleness for r in recs) / len(recs)
            print(
                f"{args.variant}: mean staleness {mean:.2f}, {dict(sorted(counts.items()))}, "
                f"{missed:.0%} of the steps over 1.25x their modelled time"
                + (f"; the run says: {h.notes[0]}" if h.notes else ""),
                flush=True,
            )


if __name__ == "__main__":
    main()
