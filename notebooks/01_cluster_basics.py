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
# # 01 · Cluster basics: jobs, tasks, servers, and where things live
#
# **What you will learn** (about 15 minutes)
#
# 1. the words of native distributed TensorFlow: *cluster*, *job*, *task*, *server*, *`ClusterSpec`*, *client*;
# 2. to start a cluster from a notebook and read its map (`spec`) and its processes (`status`);
# 3. to put variables on parameter servers and computation on workers, and to check where each one lives;
# 4. to prove that two workers really trained **one** model together, from the cluster itself;
# 5. that the source articles' TF1 `Session` programs run here unchanged.
#
# ## The picture
#
# ```text
#                  this notebook's kernel = the CLIENT
#          builds the ops and says where each one runs (tf.device)
#            │                │                 │                │       gRPC
#     ┌──────┴─────┐   ┌──────┴─────┐    ┌──────┴─────┐   ┌──────┴─────┐
#     │    ps:0    │   │    ps:1    │    │  worker:0  │   │  worker:1  │
#     │ holds some │   │ holds the  │ ◄─►│  computes  │   │  computes  │
#     │ variables  │   │ others     │    │ gradients  │   │ gradients  │
#     └────────────┘   └────────────┘    └────────────┘   └────────────┘
#       job "ps"  (parameter servers)      job "worker"
# ```
#
# * a **cluster** is a set of **jobs**; the classic ones are `ps` (parameter servers: they *hold* the
#   model's variables) and `worker` (they *compute*: forward pass, gradients);
# * each job has **tasks**, numbered from 0: `ps:0`, `ps:1`, `worker:0`, `worker:1`;
# * a **`ClusterSpec`** maps every task to a `host:port`;
# * every task runs a **server** (`tf.distribute.Server`, gRPC) that executes the ops sent to it;
# * a **client** builds the computation and says, with `tf.device("/job:worker/task:1")`, where each
#   op runs. Here the client is this notebook's kernel.
#
# Without tfmagic you would start one `python distribute.py --job_name=... --task_index=...` per task,
# on every machine, and read `ps0.out`, `worker0.out`... afterwards. Here one line starts them all.

# %%
# %load_ext tfmagic

# %% [markdown]
# **Predict:** how many operating-system processes will the next line start, and what does each one do
# until someone sends it work?

# %%
# %tf_cluster start --ps 2 --workers 2

# %% [markdown]
# Four processes, one per task. Each imported TensorFlow's server modules (not its whole Python API,
# which a server does not need), started a server and now waits for ops; `start` returned only once
# every server accepted connections. The **spec** is the map of the cluster, and each task also gets
# the `TF_CONFIG` a TF2 program would read:

# %%
# %tf_cluster spec

# %% [markdown]
# `status` shows each task as the operating system sees it. Memory is shown as **PSS** beside RSS:
# TensorFlow processes share most of their pages (the same libraries), so RSS counts that shared memory
# once per process and makes a cluster look about twice as expensive as it is.

# %%
# %tf_cluster status

# %% [markdown]
# ## The kernel as client
#
# `%%tf_device TASK` runs a cell with its ops placed on a task. The first time, the kernel connects to
# the cluster: the tasks' devices then appear beside the kernel's own CPU.

# %%
import tensorflow as tf

import tfmagic
from tfmagic import lesson

cluster = tfmagic.current_cluster()
cluster.connect()
for d in tf.config.list_logical_devices():
    print(d.name)
names = [d.name for d in tf.config.list_logical_devices()]
lesson.expect(
    any("/job:ps/" in n for n in names) and any("/job:worker/" in n for n in names),
    claim="the tasks' devices appear beside the kernel's own",
)

# %% [markdown]
# ### Variables live on the parameter servers
#
# Nothing chooses a ps for you in native TensorFlow: you say it. Here `w` goes to `ps:0` and `b` to
# `ps:1`; each is stored in that process's memory, and every worker reads it from there.

# %%
# %%tf_device ps:0
w = tf.Variable(0.0, name="w")

# %%
# %%tf_device ps:1
b = tf.Variable(0.0, name="b")
print("w lives on", w.device)
print("b lives on", b.device)
lesson.expect(w.device.startswith("/job:ps/replica:0/task:0"), claim="w is stored on ps:0")
lesson.expect(b.device.startswith("/job:ps/replica:0/task:1"), claim="b is stored on ps:1")

# %% [markdown]
# ### Ops run on the worker you name
#
# **Predict:** the next cell multiplies `w` by three numbers on `worker:1`. Where does the result
# come from, and what are its values?

# %%
# %%tf_device worker:1
x = tf.constant([1.0, 2.0, 3.0])
y = w * x + b
print("y computed on", y.device, "->", y.numpy())
lesson.expect(y.device.startswith("/job:worker/replica:0/task:1"), claim="the multiplication ran on worker:1")
lesson.expect(not y.numpy().any(), claim="the result is zeros: nothing has trained yet")

# %% [markdown]
# The multiplication ran in the worker process, which fetched `w` from `ps:0` and `b` from `ps:1`
# over gRPC; the kernel only received the result (zeros: nothing has trained yet).
#
# ## Article 004's check: fit y = 2x + 10 on the cluster
#
# The classic exercise: data from the line y = 2x + 10, a linear model whose `w` and `b` live on the
# two ps, and gradient steps computed by the workers, taking turns.
#
# **Predict:** after 200 steps, 100 on each worker, do `w` and `b` end near 2 and 10? Or does each
# worker end up with its own half-trained copy?
#
# `tf.print` is an op like any other: it prints **in the process it runs in**. The step below prints
# its progress on the worker that runs it, so the line lands in that worker's log, not here.

# %%
data_x = tf.random.stateless_uniform([256], seed=(1, 2), minval=-1.0, maxval=1.0)
data_y = 2.0 * data_x + 10.0


@tf.function
def step(i, xb, yb, lr=0.1):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(w * xb + b - yb))
    gw, gb = tape.gradient(loss, [w, b])
    w.assign_sub(lr * gw)
    b.assign_sub(lr * gb)
    if i % 25 == 0:
        tf.print("step", i, "loss", loss, "w", w, "b", b)  # in the worker's own log
    return loss


steps_by = {"worker:0": 0, "worker:1": 0}
for i in range(200):
    task = f"worker:{i % 2}"
    with cluster.device(task):
        loss = step(tf.constant(i), data_x, data_y)
    steps_by[task] += 1
print(f"w = {w.numpy():.3f}, b = {b.numpy():.3f}, loss = {loss.numpy():.6f}")
print("steps per worker:", steps_by)
lesson.expect(w.numpy(), near=2, within=0.005, claim="w ends near 2")
lesson.expect(b.numpy(), near=10, within=0.001, claim="b ends near 10: one model, trained by both workers")

# %% [markdown]
# One model: both workers updated the **same** `w` and `b`, because the variables live on the ps and
# not in the workers. Each worker's log has the lines its own `tf.print` wrote: `worker:1` ran the odd
# steps, so its log has steps 25, 75, 125 and 175 (and `worker:0`'s has 0, 50, 100 and 150):

# %%
# %tf_cluster logs worker:1 --tail 4

# %%
import re

printed = {
    task: {int(m) for m in re.findall(r"^step (\d+) loss", cluster.logs(task, tail=50), re.M)}
    for task in ("worker:0", "worker:1")
}
lesson.expect(printed["worker:1"] == {25, 75, 125, 175}, claim="worker:1's log has steps 25, 75, 125 and 175")
lesson.expect(printed["worker:0"] == {0, 50, 100, 150}, claim="worker:0's log has steps 0, 50, 100 and 150")

# %% [markdown]
# The other lines of that log are tfmagic's (`tfmagic: ...`); TensorFlow's own start-up lines are
# left out and counted in the last line (`--all` shows them).
#
# ## The map, and the proof that the workers cooperated
#
# tfmagic's training engine does what the loop above did, for a real model: it spreads the model's
# variables over the ps tasks (round-robin, in the order the model makes them), and every worker
# computes gradients on its own share of the data and sends them to the ps.
#
# **Predict:** the digits classifier has four variables: a 64 × 32 kernel, 32 biases, a 32 × 10 kernel
# and 10 biases. Round-robin over two ps: what share of the bytes does each ps hold?

# %%
# %tf_train --model digits --mode async --steps 300 --wait --no-dashboard
# %tf_cluster map

# %%
shares = {str(task): share for task, share in cluster.placement().shares().items()}
lesson.expect(shares["ps:0"], at_least=0.8, claim="ps:0 holds most of the bytes")

# %% [markdown]
# Round-robin by order is not round-robin by bytes: `ps:0` got the two big kernels and holds most of the
# bytes, and the map says so (notebook 07 shows what that costs in traffic). Our own `w` (on `ps:0`) and
# `b` (on `ps:1`) are on the map too. The *steps run* line is the proof that both workers took part; each
# worker's log tells its own share as it went, the way the source articles read `worker0.out`:

# %%
# %tf_cluster logs worker:0 --tail 3

# %% [markdown]
# ## The source articles' TF1 style still works
#
# Article 004's client used a TF1 `Session` connected to one task's gRPC target, with ops pinned by
# `tf.device`. The kernel runs in TF2's eager mode, but a `tf.Graph()` block gives the same program:

# %%
with tf.Graph().as_default():
    with tf.device("/job:ps/task:1"):
        w1 = tf.compat.v1.get_variable("w1", initializer=0.0)
        b1 = tf.compat.v1.get_variable("b1", initializer=0.0)
    with tf.device("/job:worker/task:0"):
        x1 = tf.constant([1.0, 2.0, 3.0])
        loss1 = tf.reduce_mean(tf.square(w1 * x1 + b1 - (2.0 * x1 + 10.0)))
        train1 = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss1)
    with tf.compat.v1.Session(cluster.target("worker:0")) as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for _ in range(500):
            sess.run(train1)
        w1_value, b1_value = sess.run([w1, b1])
        print("TF1 session on", cluster.target("worker:0"), "-> w = %.3f, b = %.3f" % (w1_value, b1_value))
lesson.expect(
    abs(w1_value - 2) + abs(b1_value - 10), at_most=0.05, claim="the TF1 program fits the same line"
)

# %% [markdown]
# ## Stop
#
# `stop` ends every task process. Nothing is left behind: the tasks also end by themselves if this
# kernel dies, even with `kill -9`.

# %%
# %tf_cluster stop

# %%
lesson.summary()

# %% [markdown]
# ## Exercises
#
# Start a cluster again first (`%tf_cluster start --ps 2 --workers 2`) and re-run the cells the
# exercise needs.
#
# 1. Put `b` on `ps:0` as well (in the cell that makes it) and run `%tf_cluster map` right after. What does
#    the note under the map say, and why would it matter for a model with millions of parameters?
# 2. Change the fitting loop so that `worker:1` runs three steps out of four. Do `w` and `b` still reach
#    2 and 10? What does `steps per worker` say, and what do the two workers' logs say?
# 3. Run `%tf_cluster kill worker:1`, then the fitting loop again. Which error do you get, and what does
#    `%tf_cluster why` say? Bring the worker back with `%tf_cluster restart worker:1`.
# 4. In the TF1 cell, move `w1` and `b1` to `/job:worker/task:0`. Does the result change? What would
#    change if a second client trained the same model from `worker:1`?
#
# <details><summary>Solutions (click to open)</summary>
#
# 1. Only `ps:0` is listed (`ps:1` holds nothing), with 100 % of the ps bytes, and the note calls `ps:0`'s
#    link the bottleneck and suggests more ps tasks. For 8 bytes that costs nothing; with millions of
#    parameters every worker reads and writes them all through `ps:0`'s one network card at every step,
#    while `ps:1` idles: the parameter-server bottleneck (notebook 07 measures it).
# 2. With `task = "worker:0" if i % 4 == 0 else "worker:1"`: yes, the variables are shared, so it does not
#    matter which worker computes a step; `steps per worker` shows 50 against 150, and of the eight
#    `tf.print` lines (steps 0, 25, ..., 175) `worker:0`'s log gets the two of steps 0 and 100, `worker:1`'s
#    the other six.
# 3. The loop stops at its first step on `worker:1`, before anything is sent: `cluster.device("worker:1")`
#    raises `TaskLost: worker:1 (pid ...) is not running (exit code -9); restart it: cluster.restart('worker:1')`.
#    `%tf_cluster why` says it is dead (killed by signal 9), shows the end of its log, and gives the same
#    next step. After `restart`, the loop works again, and `w` and `b` kept their values: they were on
#    the ps, which never stopped.
# 4. The result is the same (w ≈ 2, b ≈ 10), but the variables are now in `worker:0`'s memory; a second
#    client running on `worker:1` would read them across the network from `worker:0`. That is why the
#    variables of a model shared by several workers go on a ps: no worker is special.
#
# </details>
