# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 08 · What else the source articles ask: devices per task, model parallelism, resizing, TensorFlowOnSpark, weight histograms, per-worker batches
#
# **What you will learn** (about 20 minutes)
#
# 1. where each task's devices come from: a ps on the CPU only, a GPU per worker (source article 002);
# 2. **model** parallelism beside the data parallelism of every other lesson: one model split over two
#    workers (source article 001);
# 3. to resize a running cluster: a worker joins an asynchronous run and leaves it again (source article 004);
# 4. how a TensorFlowOnSpark program (`map_fun(args, ctx)`, its input modes) maps onto tfmagic (source
#    articles 000 and 003);
# 5. TensorBoard's per-layer weight histograms of a run (source article 003);
# 6. each worker its own batch size, and what sync then averages (source article 002).
#
# Each part checks what it says on the run you make (the `✓` lines).

# %%
# %load_ext tfmagic
import os

import numpy as np
import tensorflow as tf

import tfmagic
from tfmagic import lesson

tf.get_logger().setLevel("ERROR")

# %% [markdown]
# ## 1 · A ps on the CPU, a GPU per worker
#
# Source article 002 starts its ps with `CUDA_VISIBLE_DEVICES=""` so that it keeps the variables in host
# memory and leaves the GPUs to the workers, and gives each worker its own GPU. tfmagic does the same:
# a ps task always gets `CUDA_VISIBLE_DEVICES=""`, and `--gpus 0/1` gives worker:0 GPU 0 and worker:1 GPU 1.
#
# **Predict:** what does each task see?

# %%
# %tf_cluster start --ps 1 --workers 2 --gpus 0/1

# %%
# %%tf_px -o devices
import os

seen = (os.environ.get("CUDA_VISIBLE_DEVICES"), len(tf.config.list_physical_devices("GPU")))
print(f"CUDA_VISIBLE_DEVICES={seen[0]!r}, GPUs TensorFlow sees: {seen[1]}")
seen

# %%
lesson.expect(devices["ps:0"] == ("", 0), claim="the ps sees no GPU (CUDA_VISIBLE_DEVICES is empty)")
lesson.expect(
    devices["worker:0"][0] == "0" and devices["worker:1"][0] == "1", claim="each worker is given its own GPU"
)
lesson.expect(
    all(gpus <= 1 for _, gpus in devices.values()), claim="no task sees more than the one GPU it was given"
)
here = len(tf.config.list_physical_devices("GPU"))
lesson.say(
    f"This machine has **{here} GPU(s)**"
    + (": each worker sees none, and runs on its CPU." if here == 0 else ": each worker sees only its own.")
)

# %% [markdown]
# ## 2 · Model parallelism: one model split over two workers
#
# Every other lesson is **data** parallel: each worker holds the whole model and computes on its own shard of
# the data. **Model** parallelism splits the model instead: here the first layer of a small network runs on
# worker:0 and the second on worker:1, for the same batch; the activations travel between them. The
# variables live on the ps, as always.
#
# **Predict:** is the result of the split model the same as the same model on one CPU?

# %%
from tfmagic.training.models import Linear

cluster = tfmagic.current_cluster()
cluster.connect()
x_all, y_all = Linear().data.shard(0, 1)
x_batch, y_batch = tf.constant(x_all[:64]), tf.constant(y_all[:64])
init = np.random.default_rng(0)
w1_0, w2_0 = init.normal(0, 0.5, (1, 16)).astype("float32"), init.normal(0, 0.5, (16, 1)).astype("float32")

with cluster.device("ps:0"):
    w1, b1 = tf.Variable(w1_0), tf.Variable(tf.zeros([16]))
    w2, b2 = tf.Variable(w2_0), tf.Variable(tf.zeros([1]))


def split_step(lr=0.05):
    with tf.GradientTape() as tape:
        with cluster.device("worker:0"):
            hidden = tf.tanh(x_batch @ w1 + b1)  # layer 1 on worker:0
        with cluster.device("worker:1"):
            out = hidden @ w2 + b2  # layer 2 on worker:1
            loss = tf.reduce_mean(tf.square(out - y_batch))
    grads = tape.gradient(loss, [w1, b1, w2, b2])
    for v, g in zip([w1, b1, w2, b2], grads):
        v.assign_sub(lr * g)
    return hidden, out, loss


hidden, out, loss = split_step()
print("layer 1 ran on", hidden.device)
print("layer 2 ran on", out.device)
split_losses = [float(loss)] + [float(split_step()[2]) for _ in range(29)]

# the same model, the same start, on this kernel's CPU alone
cw1, cb1, cw2, cb2 = (tf.Variable(v) for v in (w1_0, tf.zeros([16]), w2_0, tf.zeros([1])))
one_losses = []
for _ in range(30):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(tf.tanh(x_batch @ cw1 + cb1) @ cw2 + cb2 - y_batch))
    for v, g in zip([cw1, cb1, cw2, cb2], tape.gradient(loss, [cw1, cb1, cw2, cb2])):
        v.assign_sub(0.05 * g)
    one_losses.append(float(loss))
print(f"loss after 30 steps: split over two workers {split_losses[-1]:.4f}, on one CPU {one_losses[-1]:.4f}")

# %%
lesson.expect("/job:worker/replica:0/task:0" in hidden.device, claim="layer 1 ran on worker:0")
lesson.expect("/job:worker/replica:0/task:1" in out.device, claim="layer 2 ran on worker:1")
lesson.expect(
    max(abs(a - b) for a, b in zip(split_losses, one_losses)),
    at_most=1e-3,
    claim="the split model computes what the same model computes on one CPU",
)
lesson.expect(split_losses[-1] < split_losses[0] / 2, claim="and it trains")

# %% [markdown]
# Same numbers: where an op runs does not change what it computes. What changes is who waits: worker:1
# cannot start layer 2 before layer 1's activations arrive from worker:0, so with one batch at a time the two
# workers take turns. That is why model parallelism pays only for models too big for one device (or with
# pipelining: several batches in flight, each worker on a different one).
#
# ## 3 · Resizing a running cluster
#
# Source article 004 asks what happens when machines join or leave. An asynchronous run on two workers; a
# third joins while it trains (`cluster.add("worker")`, or `%tf_cluster add worker`), then leaves
# (`cluster.remove("worker:2")`, `%tf_cluster remove worker:2`).
#
# **Predict:** does the run stop when a worker joins or leaves? Does the new worker get work?

# %%
import time

run = tfmagic.train(cluster, mode="async", model="digits", steps=100_000, block=False)
while run.history.steps < 50:
    time.sleep(0.1)
added = cluster.add("worker")
joined_at = time.time()
time.sleep(3)
removed = cluster.remove("worker:2")
left_at = time.time()
time.sleep(2)
print(added)
print(removed)
new = [r for r in run.history.records if str(r.task) == "worker:2"]
print(f"worker:2 made {len(new)} steps while it was in the cluster")
print("the run is", "still training" if run.running else "stopped", f"({run.history.steps} updates)")
lesson.expect(len(new), at_least=5, claim="the worker that joined got work at once")
lesson.expect(not [r for r in new if r.start > left_at], claim="after it left, it started no step")
lesson.expect(run.running, claim="the run went on through both changes")
run.stop()

# %% [markdown]
# The run never stopped: an asynchronous run gives each worker its own thread, so a new one gets a
# thread and a shard, and one that leaves finishes its step and stops. A synchronous run cannot do that
# mid-step (every update needs every worker), which is why elastic training frameworks resize between
# steps. `%tf_experiment elastic` measures the update rate at each size.
#
# ## 4 · TensorFlowOnSpark, mapped onto tfmagic
#
# Source articles 000 and 003 run their programs with TensorFlowOnSpark: `TFCluster.run(sc, map_fun, args,
# num_executors, num_ps, ...)` starts one TensorFlow task per Spark executor and calls `map_fun(args, ctx)` in
# each; `ctx` says which task it is. tfmagic's pieces, one for one:
#
# | TensorFlowOnSpark | tfmagic |
# | --- | --- |
# | `TFCluster.run(sc, map_fun, args, num_executors=3, num_ps=1)` | `%tf_cluster start --backend spark --ps 1 --workers 2` (or local, SSH) |
# | `map_fun(args, ctx)`, run in every task | a `%%tf_px` cell, run in every task |
# | `ctx.job_name`, `ctx.task_index`, `ctx.cluster_spec` | `job_name`, `task_index`, `cluster` in the cell |
# | `ctx.start_cluster_server()` | `server`: already running (`server.target`) |
# | `InputMode.TENSORFLOW`: each task reads its own files | the cell reads its own shard (`shard(task_index, n)`) |
# | `InputMode.SPARK`: Spark feeds RDD partitions to the tasks (`TFNode.DataFeed`) | no feed: the kernel's engine (`tfmagic.train`) hands each worker its shard, or a cell reads its own |
# | `cluster.shutdown()` | `%tf_cluster stop` |
#
# So a `map_fun` runs unchanged: give it a `ctx` built from what the cell finds.

# %%
# %%tf_px --targets worker:* -o mapped
from types import SimpleNamespace


def map_fun(args, ctx):  # as written for TensorFlowOnSpark (InputMode.TENSORFLOW)
    from tfmagic.training.models import Linear

    num_workers = len(ctx.cluster_spec.job_tasks("worker"))
    x, y = Linear().data.shard(ctx.task_index, num_workers)
    return f"{ctx.job_name}:{ctx.task_index} of {num_workers} read {len(x)} examples, batch {args.batch_size}"


ctx = SimpleNamespace(job_name=job_name, task_index=task_index, cluster_spec=cluster, server=server)
map_fun(SimpleNamespace(batch_size=32), ctx)

# %%
for task, line in mapped.items():
    print(task, "->", line)
lesson.expect(
    all(line.startswith(f"{task} of 2 read") for task, line in mapped.items()),
    claim="each worker's map_fun knew which task it was, and read its own shard",
)

# %%
# %tf_cluster stop

# %% [markdown]
# ## 5 · TensorBoard's weight histograms
#
# Source article 003 watches training in TensorBoard. `tfmagic.train(..., logdir=...)` writes what TensorBoard
# shows: each worker's loss and step time, and, for the whole model, a **histogram of every layer's weights**
# each time the run measures its held-out loss. `tfmagic.tensorboard.show(logdir)` opens TensorBoard in the
# notebook (through the Jupyter server's proxy where there is one); its *Histograms* tab shows them. Below,
# the same histograms read back from the event files.

# %%
# %tf_cluster start --ps 1 --workers 2
import tempfile
from pathlib import Path

from IPython.display import Image
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tfmagic import plots

logdir = Path(tempfile.mkdtemp(prefix="tb08-"))
tfmagic.train(
    tfmagic.current_cluster(), mode="async", model="digits", steps=300, logdir=logdir, name="digits"
)
events = EventAccumulator(str(logdir / "digits" / "global"), size_guidance={"tensors": 0})
events.Reload()
tags = sorted(t for t in events.Tags()["tensors"] if t.startswith("weights/"))
print("histograms written:", ", ".join(tags))
kernel = [(e.step, tf.make_ndarray(e.tensor_proto)) for e in events.Tensors("weights/hidden/kernel")]
fig = plots.histogram_figure(kernel, title="weights/hidden/kernel, as TensorBoard's Histograms tab shows it")
Image(plots.png_bytes(fig))


# %%
def spread(hist):
    """The standard deviation of the values a TensorBoard histogram (left, right, count rows) counts."""
    centres, counts = (hist[:, 0] + hist[:, 1]) / 2, hist[:, 2]
    mean = (centres * counts).sum() / counts.sum()
    return float(np.sqrt(((centres - mean) ** 2 * counts).sum() / counts.sum()))


lesson.expect(len(tags), at_least=4, claim="a histogram for each of the model's four weight tensors")
lesson.expect(len(kernel), at_least=5, claim="written again and again while it trained")
lesson.expect(
    abs(spread(kernel[-1][1]) - spread(kernel[0][1])) > 0,
    claim="the hidden layer's weights spread changed as it learned",
)
board = tfmagic.tensorboard.show(logdir)
lesson.expect(not board.error, claim="TensorBoard started for this logdir")
board

# %% [markdown]
# ## 6 · Each worker its own batch size
#
# Source article 002 gives each worker its own batch size, so that a faster machine takes more examples per
# step. In sync training the two gradients are then not worth the same: worker:0's, from 64 examples, is the
# mean over four times as many examples as worker:1's, from 16. tfmagic averages them **weighted by
# examples**, so that each update is the gradient of the mean loss over all 80 examples of the step (a plain
# mean would give worker:1's 16 examples as much say as worker:0's 64).
#
# **Predict:** how many examples does each worker take per step, and how many does one update consume?

# %%
sized = tfmagic.train(
    tfmagic.current_cluster(),
    mode="sync",
    model="digits",
    steps=60,
    batch_size={"worker:0": 64, "worker:1": 16},
    name="sized",
)
per_step = {
    t: sorted({r.examples for r in sized.records if str(r.task) == t}) for t in ("worker:0", "worker:1")
}
print("examples per step:", per_step)
print(f"examples per update: {sized.examples_seen() / sized.steps:g}")
lesson.expect(
    per_step == {"worker:0": [64], "worker:1": [16]}, claim="each worker took its own batch at every step"
)
lesson.expect(sized.examples_seen() / sized.steps, between=(80, 80), claim="each update consumed 80 examples")
lesson.expect(sized.evals[-1][2] < sized.evals[0][2], claim="and the held-out loss fell")

# %% [markdown]
# Each update was the mean over 80 examples, the 64 of worker:0 counted four times as much as the 16 of
# worker:1. The engine's test checks the weights it reaches against a single-process computation of the same
# weighted average (`tests/test_training.py`). In asynchronous training nothing is averaged: each worker's
# gradient is applied as it comes, so the larger batch only makes that worker's updates less noisy and slower.

# %%
board.kill()
# %tf_cluster stop
lesson.summary()

# %% [markdown]
# ## Exercises
#
# 1. In part 2, put both layers on worker:0. Does the loss change? What would change on two machines
#    joined by a slow network?
# 2. In part 3, add two workers instead of one (`cluster.add("worker", count=2)`). How many steps does each
#    new worker make in the same 3 s?
# 3. In part 5, train with `mode="sync"` into another run name and compare the histograms: which mode's
#    weights move further per update?
#
# <details><summary>Solutions (click to open)</summary>
#
# 1. The losses are the same (the same ops on the same numbers); only the transfer of the activations from
#    worker:0 to worker:1 disappears. On two machines that transfer costs a network round trip per batch,
#    which is what pipelined model parallelism hides.
# 2. Each gets about as many as the one did: an asynchronous worker's rate depends on its own steps, not on
#    the others', as long as the ps keeps up (on two cores the processes share the CPU, so somewhat fewer).
# 3. Sync averages two gradients per update and moves less noisily per update; async applies every
#    gradient, so per update its weights move about as far but per second further. The histograms' spread
#    shows how far the weights have moved from their start.
#
# </details>
