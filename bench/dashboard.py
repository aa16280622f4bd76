"""What the live dashboard costs: training throughput with it refreshing, over without.

Alternates async runs on one 1 ps + 2 worker cluster, without and with a
Dashboard refreshing every 0.5 s (drawing frames exactly as in a notebook),
and prints the median ratio and the time to draw one frame.

    python bench/dashboard.py [--rounds 6] [--steps 1500]
"""

from __future__ import annotations

import argparse
import statistics

import tfmagic
from tfmagic.dashboard import Dashboard
from tfmagic.training import TrainingRun
from tfmagic.training.models import Digits


def rate(h) -> float:
    g = h.global_steps
    return (len(g) - 50) / (g[-1].time - g[49].time)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=1500)
    args = parser.parse_args()
    plain, live, draws, frames = [], [], [], []
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
                dash = Dashboard(cluster, runs=[run], refresh=0.5)
                run.start()
                dash.start()
                live.append(rate(run.wait()))
                dash.wait(30)
                frames.append(dash.frames)
                # time frames on their own, with the run's data
                for _ in range(5):
                    dash.draw()
                    draws.append(dash.last_draw_s)
    a, b = statistics.median(plain), statistics.median(live)
    print(f"async without dashboard: median {a:6.1f} updates/s {[round(x, 1) for x in plain]}")
    print(f"async with dashboard   : median {b:6.1f} updates/s {[round(x, 1) for x in live]} (frames drawn {frames})")
    print(f"ratio with / without   : {b / a:.2f}  (aim >= 0.95)")
    print(f"time to draw one frame : median {statistics.median(draws) * 1000:.1f} ms, max {max(draws) * 1000:.1f} ms")


if __name__ == "__main__":
    main()
