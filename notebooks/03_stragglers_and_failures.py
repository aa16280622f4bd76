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
# # 03 · Stragglers and failures
#
# A cluster is only as fast as its behaviour under trouble. Here we make trouble on purpose:
#
# * `%tf_cluster slow worker:2 --factor 4` makes that task's process run a quarter of the time (it is paused and
#   resumed many times a second), so *everything* it does slows down: a real straggler;
# * `%tf_cluster kill worker:2` kills its process, as a crash would; `%tf_cluster restart worker:2` brings it back.
#
# We use one ps and three workers, so that sync training can have a **backup worker**
# (`SyncReplicasOptimizer`'s `replicas_to_aggregate = total_num_replicas - 1`).

# %%
# %load_ext tfmagic
# %tf_cluster start --ps 1 --workers 3

# %%
import time

import tfmagic
from tfmagic.training import TrainingError

cluster = tfmagic.current_cluster()
opts = dict(model="digits", lr=0.1, batch_size=32)


def step_time(h):
    return h.median_step_time()  # the median: a moment when the machine is busy elsewhere hardly moves it


def total_rate(h):
    return h.updates_per_s()


base_sync = tfmagic.train(cluster, mode="sync", steps=150, **opts)
base_async = tfmagic.train(cluster, mode="async", steps=450, **opts)
print(
    f"no straggler: sync {step_time(base_sync) * 1000:.1f} ms per update, async {total_rate(base_async):.1f} updates/s"
)

# %% [markdown]
# ## One slow worker paces sync SGD
#
# Sync waits for every worker at every step, so the step time follows the slowest one.
# Async does not wait: the other two workers go on at full speed.
#
# Expect the sync step time to grow by a good part of the factor, not all of it: a step here is mostly
# communication (a few milliseconds of round trips), which the pauses slow less than computation, and on a
# machine with fewer cores than tasks the other workers get the CPU that the slowed one gives up.

# %%
# %tf_cluster slow worker:2 --factor 4

# %%
slow_sync = tfmagic.train(cluster, mode="sync", steps=150, **opts)
slow_async = tfmagic.train(cluster, mode="async", steps=450, **opts)
print(
    f"sync step time with worker:2 at 1/4 speed: {step_time(slow_sync) / step_time(base_sync):.2f}x the unslowed step time"
)
print(
    f"async throughput with worker:2 at 1/4 speed: {total_rate(slow_async) / total_rate(base_async):.2f}x the unslowed throughput"
)
print(slow_async.summary())

# %% [markdown]
# ## Backup workers give sync its speed back
#
# With `backup_workers=1`, each step aggregates the first 2 of 3 gradients; the straggler's gradient arrives late,
# was computed from old parameters, and is dropped (and counted).

# %%
backup = tfmagic.train(cluster, mode="sync", steps=150, backup_workers=1, **opts)
print(
    f"sync + 1 backup worker, worker:2 slowed: {step_time(backup) / step_time(base_sync):.2f}x the unslowed step time"
)
print("gradients dropped as stale, per worker:", backup.dropped())
print(f"held-out accuracy: {backup.final_accuracy:.3f} (no straggler: {base_sync.final_accuracy:.3f})")

# %%
# %tf_cluster slow worker:2 --factor 1

# %% [markdown]
# ## A worker dies during async training
#
# Training runs in the background (`block=False`), so this notebook can kill a worker while it trains.
# Async goes on with the other two; when the worker is restarted, it rejoins. A restart without a warm spare
# starts a new process that imports TensorFlow's server core, which can take seconds on a busy machine, so the run is
# given more steps than it needs
# and stopped once worker 2 has been back at work for 100 steps.

# %%
run = tfmagic.train(cluster, mode="async", steps=100_000, block=False, **opts)
while run.history.steps < 200:
    time.sleep(0.05)
cluster.kill("worker:2")
killed_at = run.history.steps
while run.history.steps < killed_at + 300:
    time.sleep(0.05)
cluster.restart("worker:2")


def steps_since_rejoin(h):
    rejoined = [e.time for e in h.events if e.kind == "rejoin"]
    return sum(1 for r in h.by_task().get("worker:2", []) if rejoined and r.start >= rejoined[-1])


while run.running and steps_since_rejoin(run.history) < 100:
    time.sleep(0.05)
h = run.stop()
rejoined = next(e.time for e in h.events if e.kind == "rejoin")
after = sum(1 for r in h.records if r.task == "worker:2" and r.start >= rejoined)
print(h.summary())
print(f"worker:2 made {after} steps after it rejoined")
for e in h.events:
    if e.task == "worker:2":
        print(f"  step {e.step}: {e.kind} {e.detail}")

# %% [markdown]
# ## A worker dies during sync training
#
# Without backup workers, sync SGD cannot make a step without every worker. tfmagic stops at once and says why,
# instead of hanging.

# %%
run = tfmagic.train(cluster, mode="sync", steps=2000, block=False, **opts)
while run.history.steps < 50:
    time.sleep(0.05)
cluster.kill("worker:2")
t0 = time.monotonic()
try:
    run.wait()
except TrainingError as e:
    print(f"after {time.monotonic() - t0:.2f} s: {e}")
cluster.restart("worker:2")

# %% [markdown]
# ## Watch it live
#
# `%tf_train` trains in the background and shows the dashboard: throughput per worker (rolling over the
# last seconds), loss per update and over time, and the cluster. While it runs, the next cell slows
# worker 0: within a second its throughput line drops, and a mark shows when it happened.

# %%
# run = %tf_train --mode async --model digits --steps 2500 --lr 0.05

# %%
while run.history.steps < 600:
    time.sleep(0.1)
# %tf_cluster slow worker:0 --factor 4

# %%
run.wait()
run.dashboard.wait(10)  # the last frame stays, also in the saved notebook
print(run.history.summary())

# %%
# %tf_cluster stop
