"""tfmagic async training vs hand-written loops on the same cluster.

Same cluster (1 ps + 2 workers), same model (digits MLP 64-32-10), same
batch size and plain SGD, same number of updates.  tfmagic runs in this
process (which owns the cluster); each hand-written loop runs in a child
process (its own client):

* a ``ParameterServerStrategy`` + ``ClusterCoordinator`` loop (TensorFlow's
  way), one step per scheduled function;
* a plain loop: a thread per worker calling a one-step ``tf.function`` on it.

tfmagic runs one step per call (its default) and packed, 4 and 16 steps per
call (``steps_per_call``, every step still recorded); and one step per call over
TensorFlow's streaming enqueue, which tfmagic's engine no longer uses (a call to a
worker killed under it could wait a minute: ``tfmagic.training.steps``).  All alternate, several
rounds, and the medians are compared.

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


PLAIN = textwrap.dedent(
    """
    import json, sys, threading, time
    import tensorflow as tf
    from tensorflow.python.eager import context, executor
    from tfmagic.training.models import Digits

    spec, steps, batch, lr, warmup = json.loads(sys.argv[1])
    jobs = {**spec, "localhost": ["localhost:0"]}
    tf.config.experimental_connect_to_cluster(
        tf.distribute.cluster_resolver.SimpleClusterResolver(tf.train.ClusterSpec(spec), rpc_layer="grpc"),
        job_name="localhost", make_master_device_default=False)
    model = Digits()
    workers = len(spec["worker"])
    with tf.device("/job:ps/replica:0/task:0"):
        weights = [tf.Variable(w) for w in model.initial_weights(0)]
        count = tf.Variable(0, dtype=tf.int64)
    steps_of = []
    for i in range(workers):
        x, y = model.data.shard(i, workers)
        with tf.device(f"/job:worker/replica:0/task:{i}"):
            xs, ys, k = tf.identity(tf.constant(x)), tf.identity(tf.constant(y)), tf.Variable(0, dtype=tf.int64)
        n = len(x)
        def make(xs=xs, ys=ys, k=k, n=n):
            @tf.function
            def step():
                idx = (k.assign_add(1) * batch + tf.range(batch, dtype=tf.int64)) % n
                with tf.GradientTape() as tape:
                    loss = model.loss(weights, tf.gather(xs, idx), tf.gather(ys, idx))
                for g, w in zip(tape.gradient(loss, weights), weights):
                    w.assign_sub(lr * g)
                return count.assign_add(1)
            return step
        steps_of.append(make())
    marks = {}
    def run(i):
        ex = executor.new_executor(enable_async=False)
        with context.executor_scope(ex), tf.device(f"/job:worker/replica:0/task:{i}"):
            while True:
                c = int(steps_of[i]().numpy())
                if c == warmup: marks["t0"] = time.perf_counter()
                if c >= steps:
                    marks.setdefault("t1", time.perf_counter())
                    return
    threads = [threading.Thread(target=run, args=(i,)) for i in range(workers)]
    for t in threads: t.start()
    for t in threads: t.join()
    print("RATE", (steps - warmup) / (marks["t1"] - marks["t0"]), flush=True)
    """
)


def tfmagic_rate(
    cluster, steps: int, batch: int, lr: float, per_call: int = 1, streaming: bool | None = None
) -> float:
    from tfmagic.training import steps as engine

    kept = engine.ASYNC_STREAMING_ENQUEUE
    if streaming is not None:  # TensorFlow's streaming enqueue, as tfmagic used before issue 22 item 11
        engine.ASYNC_STREAMING_ENQUEUE = streaming
    try:
        h = tfmagic.train(
            cluster,
            mode="async",
            model=Digits(),
            steps=steps,
            batch_size=batch,
            lr=lr,
            steps_per_call=per_call,
        )
    finally:
        engine.ASYNC_STREAMING_ENQUEUE = kept
    g = h.global_steps
    return (len(g) - WARMUP) / (g[-1].time - g[WARMUP - 1].time)


def coordinator_rate(cluster, steps: int, batch: int, lr: float, program: str = COORDINATOR) -> float:
    env = dict(
        os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(tfmagic.__file__)), GRPC_FAIL_FAST="use_caller"
    )
    arg = json.dumps([cluster.cluster_def.as_dict(), steps, batch, lr, WARMUP])
    out = subprocess.run(
        [sys.executable, "-c", program, arg], capture_output=True, text=True, env=env, timeout=600
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
    runs = {
        "tfmagic async, 1 step per call": lambda c: tfmagic_rate(c, args.steps, args.batch, args.lr),
        "tfmagic async, 1 per call, streaming": lambda c: tfmagic_rate(
            c, args.steps, args.batch, args.lr, streaming=True
        ),
        "tfmagic async, 4 steps per call": lambda c: tfmagic_rate(c, args.steps, args.batch, args.lr, 4),
        "tfmagic async, 16 steps per call": lambda c: tfmagic_rate(c, args.steps, args.batch, args.lr, 16),
        "PSS + ClusterCoordinator": lambda c: coordinator_rate(c, args.steps, args.batch, args.lr),
        "plain loop, 1 step per call": lambda c: coordinator_rate(c, args.steps, args.batch, args.lr, PLAIN),
    }
    rates: dict[str, list[float]] = {name: [] for name in runs}
    with tfmagic.LocalCluster(ps=1, workers=2, spares=False) as cluster:
        for _ in range(args.rounds):
            for name, measure in runs.items():
                rates[name].append(measure(cluster))
    med = {name: statistics.median(r) for name, r in rates.items()}
    for name, r in rates.items():
        print(f"{name:34s}: median {med[name]:7.1f} updates/s  {[round(x, 1) for x in r]}")
    coord, plain = med["PSS + ClusterCoordinator"], med["plain loop, 1 step per call"]
    one = med["tfmagic async, 1 step per call"]
    print(f"tfmagic (1 per call) / coordinator: {one / coord:.2f}   (aim >= 0.95)")
    print(f"tfmagic (1 per call) / plain loop : {one / plain:.2f}   (aim >= 1.0)")
    streamed = med["tfmagic async, 1 per call, streaming"]
    print(
        f"tfmagic (1 per call), unary / streaming enqueue: {one / streamed:.2f}   (the cost of failing fast)"
    )
    for k in (4, 16):
        print(
            f"tfmagic ({k} per call) / coordinator: {med[f'tfmagic async, {k} steps per call'] / coord:.2f}   (aim >= 1.5)"
        )


if __name__ == "__main__":
    main()
