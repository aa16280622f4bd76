"""Per-task GPUs, checked on a machine that has them.

What it checks, on a local cluster of one ps and two workers:

* the ps sees no GPU (``CUDA_VISIBLE_DEVICES=""``, as the seeds recommend);
* each worker sees exactly one GPU, its own where the machine has as many
  GPUs as workers (``worker_gpus``), the same card otherwise;
* an op placed on ``/job:worker/task:i/device:GPU:0`` runs there, and how
  much faster than on that worker's CPU (a matrix product, side by side);
* the worker processes hold GPU memory and the ps process none
  (``nvidia-smi``), each growing as it needs rather than taking the card;
* sync and async training run to the end on those workers, every worker
  stepping and the loss falling.

    python bench/gpu_check.py [--steps 300] [--json FILE]

It prints each check with ``ok`` or ``FAILED`` and exits 1 if any failed.  On
a machine without GPUs it says so and checks that no task sees one.  CI never
runs it (no GPU there); docs/gpus.md records what it printed and where.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

RESULTS: list[dict] = []


def check(what: str, ok: bool, detail: str = "") -> bool:
    RESULTS.append({"check": what, "ok": bool(ok), "detail": detail})
    print(f"{'ok    ' if ok else 'FAILED'} {what}{': ' + detail if detail else ''}", flush=True)
    return ok


def nvidia_smi(*args: str) -> str:
    try:
        return subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def gpu_memory_by_pid() -> dict[int, int]:
    """MiB of GPU memory each process holds, as nvidia-smi reports it."""
    out = nvidia_smi("--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits")
    seen: dict[int, int] = {}
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit():
            seen[int(parts[0])] = seen.get(int(parts[0]), 0) + int(float(parts[1]))
    return seen


def timed_matmul(tf, device: str, n: int = 4096, reps: int = 10) -> float:
    """Seconds per n x n product on ``device`` (operands made there; one warm-up)."""
    with tf.device(device):
        a = tf.random.normal([n, n])
        r = tf.matmul(a, a)
        float(tf.reduce_sum(r[:1, :1]))
        t0 = time.perf_counter()
        for _ in range(reps):
            r = tf.matmul(a, r * 1e-4)
        float(tf.reduce_sum(r[:1, :1]))
    return (time.perf_counter() - t0) / reps


#: source article 002's layout in a %%tf_px cell: variables on the ps (its CPU), the work on the worker's GPU
SEED_002 = """
import os
import tensorflow.compat.v1 as tf1

gpus = len(tf.config.list_physical_devices("GPU"))
seen = {"cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"), "gpus": gpus}
here = f"/job:worker/task:{task_index}" + ("/device:GPU:0" if gpus else "")


def build(ps_device):
    graph = tf1.Graph()
    with graph.as_default():
        setter = tf1.train.replica_device_setter(worker_device=here, ps_device=ps_device, cluster=cluster)
        with tf1.device(setter):
            w = tf1.get_variable(f"w{task_index}", [1024, 1024], initializer=tf1.zeros_initializer())
            x = tf1.random.normal([1024, 1024], seed=task_index)
            target = tf1.matmul(x, tf1.eye(1024) * 0.5)
            loss = tf1.reduce_mean(tf1.square(tf1.matmul(x, w) - target))
            train = tf1.train.GradientDescentOptimizer(0.5).minimize(loss)
    return graph, w, target, loss, train


def fit(ps_device, soft):
    graph, w, target, loss, train = build(ps_device)
    with tf1.Session(server.target, graph=graph, config=tf1.ConfigProto(allow_soft_placement=soft)) as sess:
        sess.run(tf1.global_variables_initializer())
        losses = [float(sess.run([train, loss])[1]) for _ in range(30)]
    return dict(variable_on=w.device, product_on=target.device, loss=(losses[0], losses[-1]))


if job_name == "worker":
    try:  # replica_device_setter's default ps_device, as the seed writes it
        seen.update(fit("/job:ps", False), soft_placement=False)
    except Exception as exc:  # the placer's own words, then the two ways out
        seen["strict_error"] = str(exc).split("Original stack trace")[0][-1500:]
        try:
            fit("/job:ps/cpu:0", False)
            seen["ps_device_cpu_works"] = True
        except Exception as exc2:
            seen["ps_device_cpu_works"] = str(exc2)[:300]
        seen.update(fit("/job:ps", True), soft_placement=True)
seen
"""


def between_graph(cluster, pids: dict, n: int, figures: dict) -> None:
    """The seed's between-graph program in every task (%%tf_px): ps on its CPU, workers on their GPU."""
    from tfmagic.px import run_px

    outcomes = run_px(cluster, SEED_002, targets="all").wait(300)
    for task, out in sorted(outcomes.items()):
        why = "" if out.status == "ok" else f"{out.ename}: {(out.evalue or '')[:300]}"
        if not check(f"%%tf_px on {task} ran", out.status == "ok", why):
            print("".join(out.traceback)[-3000:], flush=True)
    seen = {task: out.result for task, out in outcomes.items() if out.status == "ok"}
    if len(seen) < len(outcomes):
        return
    print("between-graph:", json.dumps(seen, default=str), flush=True)
    figures["between_graph"] = seen
    check("%%tf_px: ps:0 sees no GPU", seen["ps:0"]["gpus"] == 0)
    for task in (t for t in seen if t.startswith("worker")):
        s = seen[task]
        if s.get("strict_error"):
            print(f"{task}: without soft placement:\n{s['strict_error']}", flush=True)
        check(f"%%tf_px: {task} ran without soft placement", not s.get("soft_placement"))
        check(f"%%tf_px: {task} sees {1 if n else 0} GPU", s["gpus"] == (1 if n else 0))
        check(
            f"%%tf_px: {task}'s variable is on the ps",
            s["variable_on"].startswith("/job:ps/"),
            s["variable_on"],
        )
        on_gpu = s["product_on"].endswith("GPU:0")
        check(
            f"%%tf_px: {task}'s work is on {'its GPU' if n else 'itself'}", on_gpu == bool(n), s["product_on"]
        )
        check(
            f"%%tf_px: {task}'s loss fell",
            s["loss"][1] < s["loss"][0],
            f"{s['loss'][0]:.3f} -> {s['loss'][1]:.3f}",
        )
    if n:
        held = gpu_memory_by_pid()
        check("%%tf_px: the ps process still holds no GPU memory", pids["ps:0"] not in held)


def one_round(tf, tfmagic, args, n, worker_gpus, figures: dict) -> None:
    from tfmagic.launchers import LocalLauncher
    from tfmagic.pool import default_pool

    figures["warm_spares_before"] = default_pool().count(LocalLauncher())
    print(f"warm spare processes before the start: {figures['warm_spares_before']}", flush=True)
    t0 = time.perf_counter()
    with tfmagic.LocalCluster(ps=1, workers=args.workers, worker_gpus=worker_gpus) as cluster:
        figures["start_s"] = round(time.perf_counter() - t0, 1)
        print(f"cluster up in {figures['start_s']} s", flush=True)
        pids = {str(t): p.pid for t, p in cluster.procs.items()}
        env = {
            str(t): p.request("env", keys=["CUDA_VISIBLE_DEVICES", "TF_FORCE_GPU_ALLOW_GROWTH"])["env"]
            for t, p in cluster.procs.items()
        }
        print("task environments:", json.dumps(env), flush=True)
        check("ps:0 is given no GPU", env["ps:0"]["CUDA_VISIBLE_DEVICES"] == "")
        cluster.connect()
        devices = [d.name for d in tf.config.list_logical_devices()]
        print("devices the kernel sees:", *devices, sep="\n  ", flush=True)
        check("ps:0 sees no GPU", not [d for d in devices if "/job:ps/" in d and "GPU" in d])
        for i in range(args.workers):
            mine = [
                d
                for d in devices
                if f"/job:worker/replica:0/task:{i}/" in d and d.endswith(("/device:GPU:0",))
            ]
            allgpu = [d for d in devices if f"/job:worker/replica:0/task:{i}/" in d and ":GPU:" in d]
            check(
                f"worker:{i} sees exactly {1 if n else 0} GPU",
                len(allgpu) == (1 if n else 0),
                ", ".join(allgpu),
            )
            if n and mine:
                gpu_s = timed_matmul(tf, f"/job:worker/replica:0/task:{i}/device:GPU:0")
                cpu_s = timed_matmul(tf, f"/job:worker/replica:0/task:{i}/device:CPU:0", n=2048, reps=3) * 8
                figures[f"worker:{i}"] = {"gpu_matmul_s": gpu_s, "cpu_matmul_s": cpu_s}
                with tf.device(f"/job:worker/replica:0/task:{i}/device:GPU:0"):
                    r = tf.matmul(tf.ones([2, 2]), tf.ones([2, 2]))
                check(f"an op placed on worker:{i}'s GPU ran there", r.device.endswith("GPU:0"), r.device)
                check(
                    f"worker:{i}: a 4096^3 product on its GPU against its CPU",
                    gpu_s < cpu_s,
                    f"{gpu_s * 1e3:.2f} ms vs {cpu_s * 1e3:.0f} ms (CPU: 2048^3 x 8), {cpu_s / gpu_s:.0f}x",
                )
        held = gpu_memory_by_pid()
        print("GPU memory by pid (MiB):", held, "task pids:", pids, "kernel pid:", os.getpid(), flush=True)
        if n:
            check("the ps process holds no GPU memory", pids["ps:0"] not in held)
            in_view = [t for t in pids if t.startswith("worker") and pids[t] in held]
            if held and not in_view:
                print(
                    "nvidia-smi lists pids of another namespace: the per-process check is left out",
                    flush=True,
                )
            else:
                check(
                    "each worker process holds GPU memory", len(in_view) == args.workers, ", ".join(in_view)
                )
                total = nvidia_smi("--query-gpu=memory.total", "--format=csv,noheader,nounits").split()
                if total:
                    card = int(float(total[0]))
                    biggest = max(held[pids[t]] for t in in_view)
                    check(
                        "no worker took the whole card (memory grows as needed)",
                        biggest < card / 2,
                        f"largest {biggest} MiB of {card} MiB",
                    )
        between_graph(cluster, pids, n, figures)
        for mode in ("sync", "async"):
            t1 = time.perf_counter()
            history = tfmagic.train(cluster, mode, model="digits", steps=args.steps, name=f"gpu-{mode}")
            wall = time.perf_counter() - t1
            rows = history.throughput()
            print(f"\n{mode}: {history.summary()}", flush=True)
            curve = history.loss_curve()
            k = max(1, len(curve) // 10)  # the first and last tenth of the updates
            first = sum(c[2] for c in curve[:k]) / k
            last = sum(c[2] for c in curve[-k:]) / k
            stepped = [t for t, row in rows.items() if t != "total" and row["steps"] > 0]
            figures[mode] = {
                "wall_s": round(wall, 1),
                "updates_per_s": history.updates_per_s(),
                "loss": [first, last],
            }
            check(
                f"{mode}: {args.steps} updates done",
                history.steps >= args.steps,
                f"{history.steps} in {wall:.1f} s",
            )
            check(f"{mode}: every worker stepped", len(stepped) == args.workers, ", ".join(stepped))
            check(f"{mode}: the loss fell", last < first, f"{first:.3f} -> {last:.3f}")
        held = gpu_memory_by_pid()
        print("GPU memory by pid after training (MiB):", held, flush=True)
        figures["gpu_memory_after_mib"] = {t: held.get(p) for t, p in pids.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="clusters started one after another (the second from warm spares)",
    )
    parser.add_argument("--json", default=None, help="write the checks and figures here")
    args = parser.parse_args(argv)

    cards = [line for line in nvidia_smi("-L").splitlines() if line.startswith("GPU ")]
    print(f"GPUs on this machine: {len(cards)}", *cards, sep="\n  ", flush=True)
    n = len(cards)
    worker_gpus = [str(i % n) for i in range(args.workers)] if n else None
    figures: dict = {"gpus": cards, "worker_gpus": worker_gpus}

    import tensorflow as tf

    import tfmagic

    print(f"TensorFlow {tf.__version__}, built with CUDA: {tf.test.is_built_with_cuda()}", flush=True)
    figures["tensorflow"] = tf.__version__
    for r in range(args.rounds):
        print(f"\n-- start {r + 1} of {args.rounds}{' (warm spares)' if r else ''}", flush=True)
        figures[f"round{r + 1}"] = {}
        one_round(tf, tfmagic, args, n, worker_gpus, figures[f"round{r + 1}"])
    failed = [r for r in RESULTS if not r["ok"]]
    print(f"\n{len(RESULTS) - len(failed)} of {len(RESULTS)} checks held", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"checks": RESULTS, "figures": figures}, f, indent=1, default=str)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
