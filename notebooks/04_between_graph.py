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
# # 04 · Between-graph replication: the source articles' programs, from one notebook
#
# **What you will learn** (about 20 minutes)
#
# 1. the two ways to replicate a model, *in-graph* and *between-graph*, and which one each program uses;
# 2. to run the source articles' TF1 programs (article 000's `distribute.py`, sync and async) in every task from one cell;
# 3. TensorFlow 2's own parameter-server API, `ParameterServerStrategy` + `ClusterCoordinator`, on the
#    same cluster, and why it is not `model.fit` here;
# 4. TF2's all-reduce (`MultiWorkerMirroredStrategy`), which needs no ps at all;
# 5. to compare what the four of them compute, and why they differ.
#
# Article 003 names the two ways to replicate a model:
#
# * **in-graph**: one client builds the whole computation and places its pieces on the tasks. That is what
#   notebooks 01-03 did: this kernel was the client (`%%tf_device`, `tfmagic.train`).
# * **between-graph**: every task runs *the same program*, with its own `job_name` and `task_index`, and builds
#   its own graph. That is article 000's `distribute.py`, typed once per machine, with output read from `ps0.out`,
#   `worker0.out`, `worker1.out` afterwards.
#
# ```text
#   in-graph                                   between-graph
#
#        kernel (the one client)                kernel: sends the cell, collects the output
#      ┌────────┼──────────┐                   ┌────────┼──────────┐
#      ▼        ▼          ▼                   ▼        ▼          ▼
#    ps:0   worker:0   worker:1              ps:0   worker:0   worker:1
#    holds  runs ops   runs ops              runs   runs the   runs the
#           sent to it sent to it            join() program,   program,
#                                                   a client   a client
#                                                   of ps:0    of ps:0
# ```
#
# `%%tf_px` makes between-graph one cell: the cell's code runs inside every task. Each task finds `cluster`
# (a `tf.train.ClusterSpec`), `job_name`, `task_index`, `server` (its own running server) and `TF_CONFIG`
# ready, so the source articles' programs run with only their flag parsing and their `tf.train.Server(...)` line removed.
# Output comes back live, each line prefixed with its task.

# %%
# %load_ext tfmagic
# %tf_cluster start --ps 1 --workers 2

# %%
# %%tf_px
print(
    f"I am {job_name}:{task_index}, serving {server.target}; the cluster has {cluster.num_tasks('worker')} workers"
)

# %% [markdown]
# ## Article 000, synchronous: `SyncReplicasOptimizer`
#
# The program below is article 000's, in TF1 style (`tf.compat.v1`): `replica_device_setter` puts the variables on
# the ps and the ops on this worker; `SyncReplicasOptimizer(replicas_to_aggregate, total_num_replicas)` makes
# the update synchronous (the chief runs the queue runner and the init tokens, through its session hook);
# `MonitoredTrainingSession(master=server.target, is_chief=...)` runs it. The ps's `server.join()` returns at
# once here (the ps keeps serving after the cell). The model is article 004's line y = 2x + 10, each worker on its
# own shard of tfmagic's `Linear` data; `report(step=..., loss=...)` feeds tfmagic's metrics.
#
# Two tfmagic defaults keep this fast on one machine (documented in docs/px.md): non-chief sessions look for the
# chief every 0.1 s (TF: 30 s), and a session closes after 2 s even if the chief's queue runner still waits for
# gradients (TF: 120 s).

# %% [markdown]
# **Predict:** 150 synchronous updates, two workers, two gradients aggregated per update. How many local
# steps will each worker take: 75, 150, or something else?

# %%
# %%tf_px
import numpy as np

from tfmagic.training.models import Linear

tf.compat.v1.disable_eager_execution()  # the seeds are TF1 graph programs
tf.compat.v1.reset_default_graph()

issync = True
steps, batch_size, learning_rate = 150, 16, 0.1
num_workers = len(cluster.job_tasks("worker"))

if job_name == "ps":
    server.join()
elif job_name == "worker":
    x_shard, y_shard = Linear().data.shard(task_index, num_workers)
    with tf.compat.v1.device(
        tf.compat.v1.train.replica_device_setter(
            worker_device="/job:worker/task:%d" % task_index, cluster=cluster
        )
    ):
        global_step = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [None, 1])
        y = tf.compat.v1.placeholder(tf.float32, [None, 1])
        weight = tf.compat.v1.get_variable("weight", [1, 1], initializer=tf.compat.v1.zeros_initializer())
        bias = tf.compat.v1.get_variable("bias", [1], initializer=tf.compat.v1.zeros_initializer())
        loss_value = tf.reduce_mean(tf.square(tf.matmul(x, weight) + bias - y))
        optimizer = tf.compat.v1.train.GradientDescentOptimizer(learning_rate)
        grads_and_vars = optimizer.compute_gradients(loss_value)
        if issync:
            rep_op = tf.compat.v1.train.SyncReplicasOptimizer(
                optimizer, replicas_to_aggregate=num_workers, total_num_replicas=num_workers, use_locking=True
            )
            train_op = rep_op.apply_gradients(grads_and_vars, global_step=global_step)
        else:
            train_op = optimizer.apply_gradients(grads_and_vars, global_step=global_step)
    is_chief = task_index == 0
    # SyncReplicasOptimizer's hook runs the chief queue runner and the init tokens
    hooks = [rep_op.make_session_run_hook(is_chief)] if issync else []
    hooks.append(tf.compat.v1.train.StopAtStepHook(last_step=steps))
    k = 0
    with tf.compat.v1.train.MonitoredTrainingSession(
        master=server.target, is_chief=is_chief, hooks=hooks
    ) as sess:
        while not sess.should_stop():
            idx = (k * batch_size + np.arange(batch_size)) % len(x_shard)
            _, loss, step = sess.run(
                [train_op, loss_value, global_step], feed_dict={x: x_shard[idx], y: y_shard[idx]}
            )
            report(step=step, loss=loss)
            k += 1
    with tf.compat.v1.Session(server.target) as plain:  # the variables live on the ps
        final_w, final_b = plain.run([weight, bias])
    print("worker %d: %d local steps, w = %.4f, b = %.4f" % (task_index, k, final_w[0][0], final_b[0]))

# %%
# %%tf_px --targets worker:0 -o seed_sync
(float(final_w[0][0]), float(final_b[0]))

# %% [markdown]
# Did the two workers really cooperate (article 002's question)? Ask each task how many local steps it took:

# %%
# %%tf_px --targets worker:* -o sync_local_steps
int(k)  # this task's local steps

# %%
from tfmagic import lesson

sync_total = sum(sync_local_steps.values())
for task, taken in sync_local_steps.items():
    print(f"{task}: {taken} gradients, {taken / sync_total:.0%} of {sync_total}")
lesson.expect(
    sync_total, between=(290, 360), claim="150 updates of 2 gradients each took about 300 gradients in all"
)
lesson.expect(
    min(sync_local_steps.values()) / sync_total,
    at_least=1 / 3,
    claim="each worker computed at least a third of them: the two cooperated",
)

# %% [markdown]
# The workers did not take 150 local steps each: `SyncReplicasOptimizer` aggregates *any* two gradients per
# update, so together they computed about 300, and each about half, because both started at the same
# moment: `%%tf_px` lets every task first import what the cell needs (the first cell also completes
# TensorFlow's Python API, seconds), and starts the cell's body everywhere at once. Without that, the
# first worker to finish importing would train alone while the other still imports.
#
# ## The pitfall: it counts gradients, not workers
#
# **Predict:** worker 1 now runs 8 times slower (`%tf_cluster slow`). Does each synchronous update wait for
# worker 1's gradient?
#
# A fresh cluster first, because `SyncReplicasOptimizer` left its token queue on the ps; its first cell
# imports what the program needs, before worker 1 is slowed.

# %%
# %tf_cluster start --ps 1 --workers 2 --replace

# %%
# %%tf_px
import numpy as np

from tfmagic.training.models import Linear

print(f"{job_name}:{task_index} has numpy {np.__version__} and {Linear.__name__}")

# %%
# %tf_cluster slow worker:1 --factor 8

# %%
import re
import time

import tfmagic
from tfmagic.px import run_px
from tfmagic.seeds import seed_000

t0 = time.time()
slowed = run_px(tfmagic.current_cluster(), seed_000(issync=True, steps=150)).wait(300)
slowed_local = {
    t: int(re.search(r"(\d+) local steps", o.stdout).group(1)) for t, o in slowed.items() if t != "ps:0"
}
slowed_total = sum(slowed_local.values())
print(f"150 synchronous updates in {time.time() - t0:.1f} s, same program as above")
for task, taken in slowed_local.items():
    print(f"{task}: {taken} gradients, {taken / slowed_total:.0%}")
lesson.expect(
    slowed_local["worker:1"] / slowed_total,
    at_most=0.1,
    claim="the slowed worker 1 gave almost none of the gradients, and no update waited for it",
)
lesson.expect(slowed_total, at_least=290, claim="the 150 updates still each took 2 gradients")

# %% [markdown]
# Each update took *two gradients*, and worker 0's second gradient was as good as worker 1's first:
# `replicas_to_aggregate` counts gradients, not workers. So the "synchronous" program quietly became one
# worker with a doubled batch; worker 1's rare gradients arrive late and are dropped as stale. To wait for
# every worker, a program must count per worker (tfmagic's `mode="sync"` does: one gradient from each, and
# notebook 03 shows what a straggler costs it then).
#
# ## Article 000, asynchronous
#
# The same program with `issync = False`: each worker applies its own gradients. A fresh cluster again, with
# no slowed worker.

# %% [markdown]
# **Predict:** without `SyncReplicasOptimizer`, each gradient is its own update. How will the 150 updates
# be shared between the two workers now?

# %%
# %tf_cluster start --ps 1 --workers 2 --replace

# %%
# %%tf_px
import numpy as np

from tfmagic.training.models import Linear

tf.compat.v1.disable_eager_execution()  # the seeds are TF1 graph programs
tf.compat.v1.reset_default_graph()

issync = False
steps, batch_size, learning_rate = 150, 16, 0.1
num_workers = len(cluster.job_tasks("worker"))

if job_name == "ps":
    server.join()
elif job_name == "worker":
    x_shard, y_shard = Linear().data.shard(task_index, num_workers)
    with tf.compat.v1.device(
        tf.compat.v1.train.replica_device_setter(
            worker_device="/job:worker/task:%d" % task_index, cluster=cluster
        )
    ):
        global_step = tf.compat.v1.train.get_or_create_global_step()
        x = tf.compat.v1.placeholder(tf.float32, [None, 1])
        y = tf.compat.v1.placeholder(tf.float32, [None, 1])
        weight = tf.compat.v1.get_variable("weight", [1, 1], initializer=tf.compat.v1.zeros_initializer())
        bias = tf.compat.v1.get_variable("bias", [1], initializer=tf.compat.v1.zeros_initializer())
        loss_value = tf.reduce_mean(tf.square(tf.matmul(x, weight) + bias - y))
        optimizer = tf.compat.v1.train.GradientDescentOptimizer(learning_rate)
        grads_and_vars = optimizer.compute_gradients(loss_value)
        if issync:
            rep_op = tf.compat.v1.train.SyncReplicasOptimizer(
                optimizer, replicas_to_aggregate=num_workers, total_num_replicas=num_workers, use_locking=True
            )
            train_op = rep_op.apply_gradients(grads_and_vars, global_step=global_step)
        else:
            train_op = optimizer.apply_gradients(grads_and_vars, global_step=global_step)
    is_chief = task_index == 0
    # SyncReplicasOptimizer's hook runs the chief queue runner and the init tokens
    hooks = [rep_op.make_session_run_hook(is_chief)] if issync else []
    hooks.append(tf.compat.v1.train.StopAtStepHook(last_step=steps))
    k = 0
    with tf.compat.v1.train.MonitoredTrainingSession(
        master=server.target, is_chief=is_chief, hooks=hooks
    ) as sess:
        while not sess.should_stop():
            idx = (k * batch_size + np.arange(batch_size)) % len(x_shard)
            _, loss, step = sess.run(
                [train_op, loss_value, global_step], feed_dict={x: x_shard[idx], y: y_shard[idx]}
            )
            report(step=step, loss=loss)
            k += 1
    with tf.compat.v1.Session(server.target) as plain:  # the variables live on the ps
        final_w, final_b = plain.run([weight, bias])
    print("worker %d: %d local steps, w = %.4f, b = %.4f" % (task_index, k, final_w[0][0], final_b[0]))

# %%
# %%tf_px --targets worker:0 -o seed_async
(float(final_w[0][0]), float(final_b[0]))

# %%
# %%tf_px --targets worker:* -o async_local_steps
int(k)  # this task's local steps

# %%
async_total = sum(async_local_steps.values())
for task, taken in async_local_steps.items():
    print(f"{task}: {taken} updates, {taken / async_total:.0%} of {async_total}")
lesson.expect(async_total, between=(148, 170), claim="the two workers took about 150 updates in all")
lesson.expect(
    min(async_local_steps.values()) / async_total, at_least=1 / 5, claim="each worker took at least a fifth"
)

# %% [markdown]
# Together the workers took the 150 updates, each a fair part: nobody waited, and each worker's gradient was
# computed on weights that the other may have changed meanwhile (staleness; notebook 02 measures it). The
# chief (worker 0) usually takes more: it initialises the variables and starts at once, while worker 1 starts
# when it sees them initialised (it looks every 0.1 s here) and has its own session to open; in a run of one
# or two seconds that head start is a visible part (between a half and three quarters for worker 0 in runs
# here, so the cell checks each took at least a fifth). A few more than 150 local steps is normal: a
# worker's last step may start just before the other's reaches 150.
#
# ## TF2's all-reduce: `MultiWorkerMirroredStrategy`
#
# TF2 has no synchronous parameter-server training; its synchronous way is **all-reduce**: every worker holds a
# copy of the variables and the workers average their updates among themselves, with no ps at all. The strategy
# starts each task's server itself, so the cluster is started in **collective mode** (`--collective`, no ps):
# every task then has the strategy ready as `strategy`.

# %%
# %tf_cluster start --workers 2 --collective --replace

# %%
# %%tf_px
import time

import numpy as np

from tfmagic.training.models import Linear

steps, batch_size, learning_rate = 150, 16, 0.1
x_shard, y_shard = Linear().data.shard(task_index, strategy.num_replicas_in_sync)
with strategy.scope():
    # MEAN: each replica's update is averaged over the workers by all-reduce
    weight = tf.Variable(tf.zeros([1, 1]), aggregation=tf.VariableAggregation.MEAN)
    bias = tf.Variable(tf.zeros([1]), aggregation=tf.VariableAggregation.MEAN)


@tf.function
def train_step(xb, yb):
    def replica(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.matmul(xb, weight) + bias - yb))
        gw, gb = tape.gradient(loss, [weight, bias])
        weight.assign_sub(learning_rate * gw)
        bias.assign_sub(learning_rate * gb)
        return loss

    return strategy.run(replica, args=(xb, yb))


t0 = time.time()
for k in range(steps):
    idx = (k * batch_size + np.arange(batch_size)) % len(x_shard)
    loss = train_step(tf.constant(x_shard[idx]), tf.constant(y_shard[idx]))
    report(step=k + 1, loss=float(loss))
allreduce_seconds = time.time() - t0
final_w, final_b = weight.numpy(), bias.numpy()
print(
    "worker %d: w = %.4f, b = %.4f after %d all-reduce steps in %.2f s"
    % (task_index, final_w[0][0], final_b[0], steps, allreduce_seconds)
)

# %%
# %%tf_px --targets worker:0 -o allreduce_result
(float(final_w[0][0]), float(final_b[0]), allreduce_seconds)

# %% [markdown]
# ## TF2's parameter servers: `ParameterServerStrategy` + `ClusterCoordinator`
#
# TensorFlow 2 kept parameter servers, but turned the program around: the tasks run no program at all
# (they are plain servers, exactly what `%tf_cluster start` runs), and **one coordinator** (here: this
# kernel) creates the variables on the ps and *schedules* step functions; the `ClusterCoordinator` sends
# each one to whichever worker is free. That is in-graph again, with asynchronous updates.
#
# TensorFlow's tutorial drives it with Keras' `model.fit`, which needs Keras 2 (`tf_keras`): Keras 3, the
# Keras of TensorFlow 2.16 and later, does not support parameter-server training
# ([keras-team/keras#18624](https://github.com/keras-team/keras/issues/18624)). What works, and is all
# there is to it, is a custom loop: a dataset per worker, a step function, `schedule`, `join`.
#
# It needs a cluster with a ps again; the all-reduce one has none.

# %%
# %tf_cluster start --ps 1 --workers 2 --replace

# %% [markdown]
# ### The same training, with this kernel as the client
#
# First, tfmagic's own engine on this cluster: `tfmagic.train` does in-graph what article 000's synchronous
# program did between-graph: same data shards, batch size, learning rate and number of updates.

# %%
import numpy as np

import tfmagic
from tfmagic.training.models import Linear

cluster = tfmagic.current_cluster()
data = Linear().data


def held_out(w, b):
    return float(np.mean((data.x_test * w + b - data.y_test) ** 2))


engine_sync = tfmagic.train(cluster, mode="sync", model=Linear(), steps=150, batch_size=16, lr=0.1)
print(f"kernel-driven sync (in-graph): held-out loss {engine_sync.final_loss:.5f}")

# %% [markdown]
# Now TensorFlow's own coordinator on the same cluster.
#
# **Predict:** after the next cell, where will `weight` live, and which process ran the steps?

# %%
import time

import tensorflow as tf

tf.get_logger().setLevel("ERROR")  # the strategy's INFO lines about connecting; errors still show
cluster = tfmagic.current_cluster()
strategy = tf.distribute.ParameterServerStrategy(cluster.resolver())
coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
with strategy.scope():
    weight = tf.Variable(tf.zeros([1, 1]), name="weight")
    bias = tf.Variable(tf.zeros([1]), name="bias")


def dataset_fn(context):
    x, y = data.shard(context.input_pipeline_id, context.num_input_pipelines)
    return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(16)


per_worker = coordinator.create_per_worker_dataset(
    lambda: strategy.distribute_datasets_from_function(dataset_fn)
)
batches = iter(per_worker)


@tf.function
def train_step(batches):
    def replica(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.matmul(xb, weight) + bias - yb))
        gw, gb = tape.gradient(loss, [weight, bias])
        weight.assign_sub(0.1 * gw)
        bias.assign_sub(0.1 * gb)
        return loss

    xb, yb = next(batches)
    return strategy.run(replica, args=(xb, yb))


t0 = time.time()
losses = [coordinator.schedule(train_step, args=(batches,)) for _ in range(150)]
coordinator.join()
pss_w, pss_b = float(weight.numpy()[0][0]), float(bias.numpy()[0])
print(f"weight lives on {weight.device}")
print(f"150 scheduled steps in {time.time() - t0:.2f} s: w = {pss_w:.4f}, b = {pss_b:.4f}")
print(f"last step's loss, fetched from the worker that ran it: {losses[-1].fetch():.5f}")
lesson.expect("/job:ps" in weight.device, claim="the strategy's scope put weight on the ps")

# %% [markdown]
# The variables went to the ps because the strategy's scope put them there; the steps ran on the workers
# (the coordinator chose which); the kernel fetched only what it asked for. The `RemoteValue` that
# `schedule` returns is a promise: `fetch()` waits for the step and brings its result back.

# %% [markdown]
# ## What differs and why

# %%
aw, ab, asecs = allreduce_result["worker:0"]
sw, sb = seed_sync["worker:0"]
yw, yb = seed_async["worker:0"]
rows = [
    ("all-reduce sync (MWMS, between-graph)", aw, ab),
    ("ps sync (seed 000, SyncReplicasOptimizer)", sw, sb),
    ("ps async (seed 000)", yw, yb),
    ("ps async (ParameterServerStrategy, TF2)", pss_w, pss_b),
]
for name, w, b in rows:
    print(f"{name:42s} w = {w:.4f}  b = {b:.4f}  held-out loss {held_out(w, b):.5f}")
print(f"{'kernel-driven sync (tfmagic.train)':42s} held-out loss {engine_sync.final_loss:.5f}")
lesson.expect(
    abs(held_out(aw, ab) - engine_sync.final_loss),
    at_most=1e-5,
    claim="all-reduce sync and tfmagic's kernel-driven sync reach the same held-out loss",
)
lesson.expect(
    max(held_out(w, b) for _, w, b in rows),
    at_most=0.02,
    claim="all four ways fit the line: each held-out loss is near the data's noise (variance 0.01)",
)

# %% [markdown]
# * **All-reduce sync** averages exactly one gradient per worker per step, like tfmagic's kernel-driven sync engine;
#   with the same data and learning rate they compute the same weights (a test checks it to float tolerance).
# * **ps sync** (`SyncReplicasOptimizer`) counts gradients, not workers: a step is taken when any
#   `replicas_to_aggregate` gradients have arrived, and stale ones are dropped.
# * **ps async** applies every gradient as it comes: no waiting, some staleness. `ParameterServerStrategy` does
#   the same from one coordinator instead of one program per worker.
# * Between-graph, each task builds its own graph and session; in-graph, one client drives all tasks. The first
#   scales to many workers without a central client; the second is easier to watch and to steer from a notebook.

# %%
# %tf_cluster stop

# %%
lesson.summary()

# %% [markdown]
# ## Exercises
#
# 1. In the asynchronous seed program, make worker 1 a straggler: add `import time` and
#    `if task_index == 1: time.sleep(0.02)` inside the training loop. **Predict** the split of the 150
#    updates, then run it (on a fresh `--ps 1 --workers 2` cluster).
# 2. In the `ParameterServerStrategy` cell, schedule 600 steps instead of 150. Does the held-out loss in the
#    comparison go down much? Why not?
# 3. Why did the asynchronous seed program need a fresh cluster after the synchronous one?
# 4. The coordinator picks a free worker for each step. What would happen to the `ParameterServerStrategy`
#    loop if you ran `%tf_cluster slow worker:1 --factor 8` first?
#
# <details><summary>Solutions (click to open)</summary>
#
# 1. Worker 0 takes most of the updates (each of worker 1's steps lasts at least 20 ms, worker 0's a few
#    ms): asynchronous training does not wait for a straggler, it just gets fewer gradients from it.
# 2. Hardly: the data is y = 2x + 10 plus noise of variance 0.01, and 150 steps already reach that noise
#    floor. More steps cannot fit noise that is not in the model.
# 3. `SyncReplicasOptimizer` keeps its gradient accumulators and token queue on the ps, and the variables
#    of the first program stay there too: a second program with the same variable names would find the
#    first one's state. A fresh cluster starts from empty ps tasks (in TF1 terms, a new `ps0`).
# 4. The coordinator sends each step to a free worker, so worker 0 takes most of them and the loop slows
#    down only by the steps worker 1 still holds. It is the same lesson as the pitfall above, from the other
#    side: nothing there waits for a particular worker.
#
# </details>
