"""tfmagic async training vs a hand-written ParameterServerStrategy + ClusterCoordinator loop.

Same cluster (1 ps + 2 workers), same model (digits MLP 64-32-10), same
batch size and plain SGD, same number of updates.  tfmagic runs in this
process (which owns the cluster); the hand-written loop runs in a child
process (ParameterServerStrategy connects its own client).  The two
alternate, several rounds, and the medians are compared.

    python bench/async_vs_coordinator.py [--rounds 3] [--steps 600]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap

import tfmagic
from tfmagic.training.models import Digits

WARMUP = 50

COORDINATOR = textwrap.dedent(
    """
    import json, sys, time
    import numpy as np
    import tensorflow as tf
    from tfmagic.training.models import Digits

    spec, steps, batch, lr, warmup = json.loads(sys.argv[1])
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(tf.train.ClusterSpec(spec), rpc_layer="grpc")
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    model = Digits()
    workers = len(spec["worker"])
    with strategy.scope():
        weights = [tf.Variable(w) for w in model.initial_weights(0)]

    def dataset_fn(ctx=None):
        # each worker gets its own shard, as tfmagic's engine does
        index = 0 if ctx is None else ctx.input_pipeline_id
        x, y = model.data.shard(index % workers, workers)
        return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(batch)

    per_worker = coordinator.create_per_worker_dataset(
        lambda: strategy.distribute_datasets_from_function(dataset_fn))
    iterator = iter(per_worker)

    @tf.function
    def step(it):
        def replica(xb, yb):
            with tf.GradientTape() as tape:
                loss = model.loss(weights, xb, yb)
            grads = tape.gradient(loss, weights)
            for g, w in zip(grads, weights):
                w.assign_sub(lr * g)
            return loss
        xb, yb = next(it)
        return strategy.run(replica, args=(xb, yb))

    for _ in range(warmup):
        coordinator.schedule(step, args=(iterator,))
    coordinator.join()
    t0 = time.perf_counter()
    for _ in range(steps - warmup):
        coordinator.schedule(step, args=(iterator,))
    coordinator.join()
    print("RATE", (steps - warmup) / (time.perf_counter() - t0), flush=True)
    """
)


def tfmagic_rate(cluster, steps: int, batch: int, lr: float) -> float:
    h = tfmagic.train(cluster, mode="async", model=Digits(), steps=steps, batch_size=batch, lr=lr)
    g = h.global_steps
    return (len(g) - WARMUP) / (g[-1].time - g[WARMUP - 1].time)


def coordinator_rate(cluster, steps: int, batch: int, lr: float) -> float:
    env = dict(
        os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(tfmagic.__file__)), GRPC_FAIL_FAST="use_caller"
    )
    arg = json.dumps([cluster.cluster_def.as_dict(), steps, batch, lr, WARMUP])
    out = subprocess.run(
        [sys.executable, "-c", COORDINATOR, arg], capture_output=True, text=True, env=env, timeout=600
    )
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RATE")]
    if not lines:
        raise RuntimeError(out.stderr[-3000:])
    return float(lines[0].split()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()
    ours, theirs = [], []
    with tfmagic.LocalCluster(ps=1, workers=2, spares=False) as cluster:
        for _ in range(args.rounds):
            ours.append(tfmagic_rate(cluster, args.steps, args.batch, args.lr))
            theirs.append(coordinator_rate(cluster, args.steps, args.batch, args.lr))
    a, b = statistics.median(ours), statistics.median(theirs)
    print(f"tfmagic async          : median {a:7.1f} updates/s  {[round(x, 1) for x in ours]}")
    print(f"PSS + ClusterCoordinator: median {b:7.1f} updates/s  {[round(x, 1) for x in theirs]}")
    print(f"ratio tfmagic / coordinator: {a / b:.2f}   (aim >= 0.95)")


if __name__ == "__main__":
    main()
