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
# Distributed TensorFlow (the seeds' *native* distribution) is built from a few ideas:
#
# * a **cluster** is a set of **jobs**; the classic ones are `ps` (parameter servers: they *hold* the model's variables)
#   and `worker` (they *compute*: forward pass, gradients);
# * each job has one or more **tasks**, numbered from 0: `ps:0`, `worker:0`, `worker:1`;
# * a **`ClusterSpec`** maps every task to a `host:port`;
# * every task runs a **server** (`tf.distribute.Server`, gRPC) that executes the ops sent to it;
# * a **client** builds the computation and says, with `tf.device("/job:worker/task:1")`, where each op runs.
#
# Without tfmagic you would write one `python distribute.py --job_name=... --task_index=...` per task, on every
# machine, and read `ps0.out`, `worker0.out`... afterwards. Here one line starts them all, and this notebook's
# kernel becomes the client.

# %%
# %load_ext tfmagic

# %%
# %tf_cluster start --ps 1 --workers 2

# %% [markdown]
# Three processes are now running, one per task. Each one imported TensorFlow's server modules (not its
# whole Python API, which a server does not need) and started a server; `start` returned only once every
# server accepted connections. The **spec** is the map of the cluster,
# and each task also gets the `TF_CONFIG` a TF2 program would read:

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
# `%%tf_device TASK` runs a cell with its ops placed on a task. The first time, the kernel connects to the
# cluster: the remote tasks' devices then appear beside the local CPU.

# %%
import tensorflow as tf

import tfmagic

cluster = tfmagic.current_cluster()
cluster.connect()
for d in tf.config.list_logical_devices():
    print(d.name)

# %% [markdown]
# ### Variables live on the parameter server
#
# Create the model's variables under `%%tf_device ps:0`: they are stored in the ps process's memory,
# and every worker reads them from there.

# %%
# %%tf_device ps:0
w = tf.Variable(0.0, name="w")
b = tf.Variable(0.0, name="b")
print("w lives on", w.device)

# %% [markdown]
# ### Ops run on the worker you name
#
# The same variables, used from a cell placed on `worker:1`: the multiplication runs in the worker process,
# which fetched `w` from the ps over gRPC.

# %%
# %%tf_device worker:1
x = tf.constant([1.0, 2.0, 3.0])
y = w * x + b
print("y computed on", y.device, "->", y.numpy())

# %% [markdown]
# ## Seed 004's check: fit y = 2x + 10 on the cluster
#
# The classic exercise: data from the line y = 2x + 10, a linear model whose `w` and `b` live on the ps,
# and gradient steps computed on the workers, taking turns. If the cluster really shares its parameters,
# `w` ends near 2 and `b` near 10 although no single worker did all the work.

# %%
data_x = tf.random.stateless_uniform([256], seed=(1, 2), minval=-1.0, maxval=1.0)
data_y = 2.0 * data_x + 10.0


@tf.function
def step(xb, yb, lr=0.1):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(w * xb + b - yb))
    gw, gb = tape.gradient(loss, [w, b])
    w.assign_sub(lr * gw)
    b.assign_sub(lr * gb)
    return loss


for i in range(200):
    with cluster.device(f"worker:{i % 2}"):
        loss = step(data_x, data_y)
print(f"w = {w.numpy():.3f}, b = {b.numpy():.3f}, loss = {loss.numpy():.6f}")

# %% [markdown]
# ## The seeds' TF1 style still works
#
# Seed 004's client used a TF1 `Session` connected to one task's gRPC target, with ops pinned by
# `tf.device`. The kernel runs in TF2's eager mode, but a `tf.Graph()` block gives the same program:

# %%
with tf.Graph().as_default():
    with tf.device("/job:worker/task:0"):
        x1 = tf.constant([1.0, 2.0, 3.0])
        w1 = tf.compat.v1.get_variable("w1", initializer=0.0)
        b1 = tf.compat.v1.get_variable("b1", initializer=0.0)
        loss1 = tf.reduce_mean(tf.square(w1 * x1 + b1 - (2.0 * x1 + 10.0)))
        train1 = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss1)
    with tf.compat.v1.Session(cluster.target("worker:0")) as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for _ in range(500):
            sess.run(train1)
        print(
            "TF1 session on", cluster.target("worker:0"), "-> w = %.3f, b = %.3f" % tuple(sess.run([w1, b1]))
        )

# %% [markdown]
# ## Every task keeps its own log
#
# What the seeds read from `ps0.out` and `worker0.out` is one command away:

# %%
# %tf_cluster logs worker:1 --tail 5

# %% [markdown]
# ## Stop
#
# `stop` ends every task process. Nothing is left behind: the tasks also end by themselves if this
# kernel dies, even with `kill -9`.

# %%
# %tf_cluster stop
