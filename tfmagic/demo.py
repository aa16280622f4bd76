"""The main job: a real distributed computation on a local cluster, end to end.

``tfmagic demo`` starts one ps and two workers, fits the seeds' line
y = 2x + 10 with the variables on the ps and the gradient steps alternating
between the workers, prints w and b, the cluster's status, and stops
everything it started.
"""

from __future__ import annotations

import time

from .cluster import LocalCluster


def linear_fit(cluster, steps: int = 300, lr: float = 0.05, seed: int = 0) -> dict:
    """Fit y = 2x + 10: variables on ps:0, each step computed on a worker in turn.

    Returns w, b, the final loss and how many steps each worker ran, so a
    caller can check that the workers really cooperated on shared variables.
    """
    import tensorflow as tf

    cluster.connect()
    rng = tf.random.Generator.from_seed(seed)
    x = rng.uniform([256], -1.0, 1.0)
    y = 2.0 * x + 10.0 + rng.normal([256], stddev=0.01)
    with cluster.device("ps:0" if cluster.shape.ps else "worker:0"):
        w = tf.Variable(0.0, name="w")
        b = tf.Variable(0.0, name="b")

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(w * xb + b - yb))
        gw, gb = tape.gradient(loss, [w, b])
        w.assign_sub(lr * gw)
        b.assign_sub(lr * gb)
        return loss

    workers = [f"worker:{i}" for i in range(cluster.shape.workers)]
    per_worker = dict.fromkeys(workers, 0)
    loss = None
    for i in range(steps):
        task = workers[i % len(workers)]
        with cluster.device(task):
            loss = step(x, y)
        per_worker[task] += 1
    return {
        "w": float(w.numpy()),
        "b": float(b.numpy()),
        "loss": float(loss.numpy()),
        "w_device": w.device,
        "steps_per_worker": per_worker,
    }


def throughput_table(histories) -> str:
    """Per-worker steps/s and examples/s of each run, side by side."""
    lines = [
        f"{'run':6s} {'task':9s} {'steps':>6s} {'steps/s':>8s} {'examples/s':>11s} {'dropped':>8s} {'staleness':>9s}"
    ]
    for h in histories:
        drops, stale = h.dropped(), h.staleness()
        for task, row in h.throughput().items():
            st = f"{stale[task]:.2f}" if h.mode == "async" and task in stale else "-"
            lines.append(
                f"{h.run:6s} {task:9s} {row['steps']:6d} {row['steps_per_s']:8.1f} {row['examples_per_s']:11.0f} "
                f"{drops.get(task, 0) if task != 'total' else sum(drops.values()):8d} {st:>9s}"
            )
    return "\n".join(lines)


def run(
    ps: int = 1, workers: int = 2, steps: int = 300, plot: str = "tfmagic-demo.png", train_steps: int = 300
) -> int:
    import os

    from . import logfilter
    from .procs import owner

    t0 = time.monotonic()
    if os.environ.get("TFMAGIC_SHOW_TF_LOGS", "") not in ("1", "true", "yes"):
        logfilter.install(owner.runtime_dir() / "demo-native.log")
    print(f"Starting a local cluster: {ps} ps, {workers} workers ...", flush=True)
    with LocalCluster(ps=ps, workers=workers, spares=False) as cluster:
        out = cluster.last_outcome
        print(f"Cluster up in {out.seconds:.1f} s: {cluster.cluster_def.as_dict()}")
        print(f"Security: {cluster.launcher.security_note()}.")
        result = linear_fit(cluster, steps=steps)
        print(
            f"Fitted y = w*x + b on the cluster: w = {result['w']:.3f}, b = {result['b']:.3f} "
            f"(truth: 2, 10), final loss {result['loss']:.5f}"
        )
        print(f"Variables live on {result['w_device']}; steps per worker: {result['steps_per_worker']}")
        print()
        print(
            f"Sync vs async on the digits classifier ({train_steps} updates each, same start) ...", flush=True
        )
        from .plots import convergence_figure, save_png
        from .training import compare

        comp = compare(cluster, model="digits", steps=train_steps, lr=0.1, batch_size=32)
        histories = comp.histories
        for h in histories:
            if h.error:
                print(f"{h.run} stopped: {h.error}")
        print(throughput_table(histories))
        print()
        print(comp.table())  # examples each mode consumed, warm-up apart from the training seconds
        for h in histories:
            print(f"{h.run:6s} final held-out loss {h.final_loss:.4f}, accuracy {h.final_accuracy:.3f}")
        if plot:
            path = save_png(convergence_figure(histories), plot)
            print(f"Convergence plot (held-out loss per update, per example, per second) written to {path}")
        print()
        print(cluster.status())
    # A killed task is reaped by its reader thread a moment later (longer on a busy machine): a process
    # counts as left behind only if it is still there after a few seconds.
    deadline = time.monotonic() + 5.0
    while owner.processes() and time.monotonic() < deadline:
        time.sleep(0.05)
    left = owner.processes()
    print(f"Stopped; processes left behind: {len(left)}. Total {time.monotonic() - t0:.1f} s.")
    ok = abs(result["w"] - 2) < 0.05 and abs(result["b"] - 10) < 0.05 and not left
    ok = ok and all(h.error is None for h in histories)
    return 0 if ok else 1
