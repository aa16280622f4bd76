"""What the live dashboard costs: training throughput with it refreshing, over without.

Rotates async runs on one 1 ps + 2 worker cluster: without a dashboard, with
a Dashboard asked to refresh every 0.5 s (drawing frames exactly as in a
notebook: a short GIL switch interval, frames spaced to its CPU budget), and
with one as it was before those two (every 0.5 s, CPython's 5 ms switch
interval), and prints the median ratios, the time to draw one frame, and
the CPU the dashboard's thread used per second of training (a figure the
machine's noise does not move much, unlike the ratio).

    python bench/dashboard.py [--rounds 10] [--steps 1500] [--traffic on|off] [--budget 0.04]
    python bench/dashboard.py --workers 32 --processes auto   # the summarised plots of many workers
"""

from __future__ import annotations

import argparse
import statistics
import time
from contextlib import nullcontext

import tfmagic
from tfmagic import dashboard, gilshare
from tfmagic.dashboard import Dashboard
from tfmagic.dashboard import widget as dashboard_widget
from tfmagic.training import TrainingRun
from tfmagic.training.models import Digits

ARMS = ["none", "now", "before"]
ARMS_SAID = {
    "none": "without a dashboard",
    "now": "with the dashboard",
    "before": "with it as it was (0.5 s, 5 ms)",
}


def rate(h) -> float:
    g = h.global_steps
    return (len(g) - 50) / (g[-1].time - g[49].time)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument(
        "--traffic",
        choices=["on", "off"],
        default="on",
        help="the dashboard's traffic panel (its meter samples ss)",
    )
    parser.add_argument("--budget", type=float, default=dashboard.BUDGET, help="the dashboard's CPU budget")
    parser.add_argument("--workers", type=int, default=2, help="past 8 the plots summarise the workers")
    parser.add_argument("--processes", default=None, help="tasks sharing processes: a number or auto")
    args = parser.parse_args()
    shared = (
        {}
        if args.processes is None
        else {"processes": int(args.processes) if args.processes.isdigit() else args.processes}
    )
    rates: dict[str, list[float]] = {arm: [] for arm in ARMS}
    draws, frames, full, cpu, intervals = [], [], [], [], []
    update = Dashboard.update

    def timed_update(self):  # CPU time of the refresh thread, frame by frame
        t0 = time.thread_time()
        update(self)
        self.cpu_s = getattr(self, "cpu_s", 0.0) + time.thread_time() - t0

    Dashboard.update = timed_update
    model = Digits()
    with tfmagic.LocalCluster(ps=1, workers=args.workers, spares=False, **shared) as cluster:
        tfmagic.train(cluster, mode="async", model=model, steps=100)  # warm up connections and tracing
        for i in range(args.rounds):
            # the arms in a rotating order, so drift on a noisy machine favours none of them
            for arm in ARMS[i % 3 :] + ARMS[: i % 3]:
                if arm == "none":
                    rates[arm].append(
                        rate(tfmagic.train(cluster, mode="async", model=model, steps=args.steps))
                    )
                    continue
                run = TrainingRun(cluster, "async", model=model, steps=args.steps)
                before = arm == "before"  # as the dashboard was: every 0.5 s, CPython's 5 ms switch interval
                dashboard_widget.yielding = nullcontext if before else gilshare.yielding
                dash = Dashboard(
                    cluster,
                    runs=[run],
                    refresh=0.5,
                    traffic=args.traffic == "on",
                    budget=0.0 if before else args.budget,
                )
                run.start()
                dash.start()
                h = run.wait()
                rates[arm].append(rate(h))
                dash.wait(30)
                if before:
                    continue
                frames.append(dash.frames)
                full.append((dash.full_draws, dash.axes_draws))
                intervals.append(round(dash.interval, 2))
                cpu.append(dash.cpu_s / (h.ended_at - h.started_at))
                # time frames on their own, with the run's data
                for _ in range(5):
                    dash.draw()
                    draws.append(dash.last_draw_s)
    a = statistics.median(rates["none"])
    for arm, label in ARMS_SAID.items():
        b = statistics.median(rates[arm])
        print(f"async {label:28s}: median {b:6.1f} updates/s {[round(x, 1) for x in rates[arm]]}")
    b, old = statistics.median(rates["now"]), statistics.median(rates["before"])
    print(
        f"ratio with / without dashboard: {b / a:.2f}  (aim >= 0.95; traffic panel {args.traffic},"
        f" budget {args.budget:.0%}, {args.workers} workers); the dashboard as it was: {old / a:.2f}"
    )
    print(f"frames drawn per run          : {frames}; last spacing {intervals} s (asked 0.5 s)")
    print(
        f"time to draw one frame        : median {statistics.median(draws) * 1000:.1f} ms,"
        f" max {max(draws) * 1000:.1f} ms"
    )
    print(
        f"(whole figure, frames redrawing some axes) per run: {full}"
        " (147 ms for all five axes, 23-40 ms each; the other frames only redraw lines)"
    )
    print(
        f"dashboard thread CPU          : median {statistics.median(cpu) * 1000:.0f} ms per second of training"
    )


if __name__ == "__main__":
    main()
