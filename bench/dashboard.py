"""What the live dashboard costs: training throughput with it refreshing, over without.

Alternates async runs on one 1 ps + 2 worker cluster, without and with a
Dashboard refreshing every 0.5 s (drawing frames exactly as in a notebook),
and prints the median ratio, the time to draw one frame, and the CPU the
dashboard's thread used per second of training (a figure the machine's
noise does not move much, unlike the ratio).

    python bench/dashboard.py [--rounds 10] [--steps 1500] [--traffic on|off]
"""

from __future__ import annotations

import argparse
import statistics
import time

import tfmagic
from tfmagic.dashboard import Dashboard
from tfmagic.training import TrainingRun
from tfmagic.training.models import Digits


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
    args = parser.parse_args()
    plain, live, draws, frames, full, cpu = [], [], [], [], [], []
    update = Dashboard.update

    def timed_update(self):  # CPU time of the refresh thread, frame by frame
        t0 = time.thread_time()
        update(self)
        self.cpu_s = getattr(self, "cpu_s", 0.0) + time.thread_time() - t0

    Dashboard.update = timed_update
    model = Digits()
    with tfmagic.LocalCluster(ps=1, workers=2, spares=False) as cluster:
        tfmagic.train(cluster, mode="async", model=model, steps=100)  # warm up connections and tracing
        for i in range(args.rounds):
            # ABBA order, so drift on a noisy machine does not favour either side
            for with_dashboard in (False, True) if i % 2 == 0 else (True, False):
                if not with_dashboard:
                    plain.append(rate(tfmagic.train(cluster, mode="async", model=model, steps=args.steps)))
                    continue
                run = TrainingRun(cluster, "async", model=model, steps=args.steps)
                dash = Dashboard(cluster, runs=[run], refresh=0.5, traffic=args.traffic == "on")
                run.start()
                dash.start()
                h = run.wait()
                live.append(rate(h))
                dash.wait(30)
                frames.append(dash.frames)
                full.append(dash.full_draws)
                cpu.append(dash.cpu_s / (h.ended_at - h.started_at))
                # time frames on their own, with the run's data
                for _ in range(5):
                    dash.draw()
                    draws.append(dash.last_draw_s)
    a, b = statistics.median(plain), statistics.median(live)
    print(f"async without dashboard: median {a:6.1f} updates/s {[round(x, 1) for x in plain]}")
    print(
        f"async with dashboard   : median {b:6.1f} updates/s {[round(x, 1) for x in live]} (frames drawn {frames})"
    )
    print(f"ratio with / without   : {b / a:.2f}  (aim >= 0.95; traffic panel {args.traffic})")
    print(
        f"time to draw one frame : median {statistics.median(draws) * 1000:.1f} ms, max {max(draws) * 1000:.1f} ms"
    )
    print(f"axes redrawn per run   : {full} (60-140 ms each; the other frames only redraw lines)")
    print(f"dashboard thread CPU   : median {statistics.median(cpu) * 1000:.0f} ms per second of training")


if __name__ == "__main__":
    main()
