"""Writes the teaching notebooks from the cell lists below (run: python notebooks/_make.py).

The notebooks are product; this file keeps their source reviewable as plain
Python.  `tests/test_notebooks.py` executes the written .ipynb files.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).parent


def md(text: str):
    return new_markdown_cell(text.strip("\n"))


def code(text: str):
    return new_code_cell(text.strip("\n"))


NB01 = [
    md("""
# 01 · Cluster basics: jobs, tasks, servers, and where things live

Distributed TensorFlow (the seeds' *native* distribution) is built from a few ideas:

* a **cluster** is a set of **jobs**; the classic ones are `ps` (parameter servers: they *hold* the model's variables)
  and `worker` (they *compute*: forward pass, gradients);
* each job has one or more **tasks**, numbered from 0: `ps:0`, `worker:0`, `worker:1`;
* a **`ClusterSpec`** maps every task to a `host:port`;
* every task runs a **server** (`tf.distribute.Server`, gRPC) that executes the ops sent to it;
* a **client** builds the computation and says, with `tf.device("/job:worker/task:1")`, where each op runs.

Without tfmagic you would write one `python distribute.py --job_name=... --task_index=...` per task, on every
machine, and read `ps0.out`, `worker0.out`... afterwards. Here one line starts them all, and this notebook's
kernel becomes the client.
"""),
    code("%load_ext tfmagic"),
    code("%tf_cluster start --ps 1 --workers 2"),
    md("""
Three processes are now running, one per task. Each one imported TensorFlow's server modules (not its
whole Python API, which a server does not need) and started a server; `start` returned only once every
server accepted connections. The **spec** is the map of the cluster,
and each task also gets the `TF_CONFIG` a TF2 program would read:
"""),
    code("%tf_cluster spec"),
    md("""
`status` shows each task as the operating system sees it. Memory is shown as **PSS** beside RSS:
TensorFlow processes share most of their pages (the same libraries), so RSS counts that shared memory
once per process and makes a cluster look about twice as expensive as it is.
"""),
    code("%tf_cluster status"),
    md("""
## The kernel as client

`%%tf_device TASK` runs a cell with its ops placed on a task. The first time, the kernel connects to the
cluster: the remote tasks' devices then appear beside the local CPU.
"""),
    code("""
import tensorflow as tf
import tfmagic

cluster = tfmagic.current_cluster()
cluster.connect()
for d in tf.config.list_logical_devices():
    print(d.name)
"""),
    md("""
### Variables live on the parameter server

Create the model's variables under `%%tf_device ps:0`: they are stored in the ps process's memory,
and every worker reads them from there.
"""),
    code("""
%%tf_device ps:0
w = tf.Variable(0.0, name="w")
b = tf.Variable(0.0, name="b")
print("w lives on", w.device)
"""),
    md("""
### Ops run on the worker you name

The same variables, used from a cell placed on `worker:1`: the multiplication runs in the worker process,
which fetched `w` from the ps over gRPC.
"""),
    code("""
%%tf_device worker:1
x = tf.constant([1.0, 2.0, 3.0])
y = w * x + b
print("y computed on", y.device, "->", y.numpy())
"""),
    md("""
## Seed 004's check: fit y = 2x + 10 on the cluster

The classic exercise: data from the line y = 2x + 10, a linear model whose `w` and `b` live on the ps,
and gradient steps computed on the workers, taking turns. If the cluster really shares its parameters,
`w` ends near 2 and `b` near 10 although no single worker did all the work.
"""),
    code("""
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
"""),
    md("""
## The seeds' TF1 style still works

Seed 004's client used a TF1 `Session` connected to one task's gRPC target, with ops pinned by
`tf.device`. The kernel runs in TF2's eager mode, but a `tf.Graph()` block gives the same program:
"""),
    code("""
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
        print("TF1 session on", cluster.target("worker:0"), "-> w = %.3f, b = %.3f" % tuple(sess.run([w1, b1])))
"""),
    md("""
## Every task keeps its own log

What the seeds read from `ps0.out` and `worker0.out` is one command away:
"""),
    code("%tf_cluster logs worker:1 --tail 5"),
    md("""
## Stop

`stop` ends every task process. Nothing is left behind: the tasks also end by themselves if this
kernel dies, even with `kill -9`.
"""),
    code("%tf_cluster stop"),
]


NB02 = [
    md("""
# 02 · Sync vs async training

Seed 001 states the trade-off this notebook measures on a real cluster:

* **synchronous SGD**: every step, each worker computes a gradient from the *same* parameters; the gradients
  are averaged and applied once. The loss falls smoothly, but each step waits for the slowest worker.
* **asynchronous SGD** (Downpour): each worker applies its gradient as soon as it has one. Nobody waits, but a
  worker's gradient may have been computed from parameters that others have already changed: it is **stale**.

Both runs below start from the same initial weights, train the same model (a small MLP on scikit-learn's
handwritten digits) on the same data shards, with one ps and two workers, and apply the same number of updates.
"""),
    code("""
%load_ext tfmagic
%tf_cluster start --ps 1 --workers 2
"""),
    code("""
import tfmagic
from IPython.display import Image
from tfmagic import plots

cluster = tfmagic.current_cluster()
comp = tfmagic.compare(cluster, model="digits", steps=400, lr=0.1, batch_size=32)
sync, async_ = comp.histories
print(comp.table())
"""),
    md("""
## Convergence per update and per second

Per **update** the two curves are close: an async update is almost as good as a sync one here (two workers make
gradients only slightly stale). Per **second** async is ahead: it applies an update whenever any worker is done,
while sync pays for a full round (both workers, then the apply) per update.
"""),
    code("Image(plots.png_bytes(plots.convergence_figure(comp.histories)))"),
    code("""
print(f"updates per second: sync {sync.updates_per_s():.1f}, async {async_.updates_per_s():.1f} "
      f"-> async applies {async_.updates_per_s() / sync.updates_per_s():.2f}x as many updates per second")
print(f"held-out loss after {sync.steps} updates: sync {sync.final_loss:.4f}, async {async_.final_loss:.4f}")
print(f"accuracy: sync {sync.final_accuracy:.3f}, async {async_.final_accuracy:.3f}")
"""),
    md("""
## Throughput per worker

In sync mode both workers do every step, so their throughput is identical: the slower one sets it
(each worker step counts, so sync's total worker steps are twice its updates). In async mode each worker
runs at its own pace, and every worker step is an update.
"""),
    code("""
for h in comp.histories:
    print(h.summary())
    print()
"""),
    md("""
## Staleness

For every async step tfmagic records how many updates *other* workers applied between this worker reading
the parameters and applying its gradient. Zero means the gradient was fresh.
"""),
    code("""
stale = async_.staleness()
for task, mean in sorted(stale.items()):
    recs = [r for r in async_.records if r.task == task]
    fresh = sum(1 for r in recs if r.staleness == 0) / len(recs)
    print(f"{task}: mean staleness {mean:.2f}, {fresh:.0%} of its gradients were fresh, max {max(r.staleness for r in recs)}")
Image(plots.png_bytes(plots.staleness_figure(async_)))
"""),
    md("""
With more workers, or a slow one (notebook 03), gradients get staler and async's loss gets noisier.
Adagrad (`optimizer="adagrad"`) is what Dean et al. used to steady Downpour SGD.
"""),
    code("%tf_cluster stop"),
]

NB03 = [
    md("""
# 03 · Stragglers and failures

A cluster is only as fast as its behaviour under trouble. Here we make trouble on purpose:

* `%tf_cluster slow worker:2 --factor 4` makes that task's process run a quarter of the time (it is paused and
  resumed many times a second), so *everything* it does slows down: a real straggler;
* `%tf_cluster kill worker:2` kills its process, as a crash would; `%tf_cluster restart worker:2` brings it back.

We use one ps and three workers, so that sync training can have a **backup worker**
(`SyncReplicasOptimizer`'s `replicas_to_aggregate = total_num_replicas - 1`).
"""),
    code("""
%load_ext tfmagic
%tf_cluster start --ps 1 --workers 3
"""),
    code("""
import time
import tfmagic
from tfmagic.training import TrainingError

cluster = tfmagic.current_cluster()
opts = dict(model="digits", lr=0.1, batch_size=32)

def step_time(h):
    return h.median_step_time()   # the median: a moment when the machine is busy elsewhere hardly moves it

def total_rate(h):
    return h.updates_per_s()

base_sync = tfmagic.train(cluster, mode="sync", steps=150, **opts)
base_async = tfmagic.train(cluster, mode="async", steps=450, **opts)
print(f"no straggler: sync {step_time(base_sync) * 1000:.1f} ms per update, async {total_rate(base_async):.1f} updates/s")
"""),
    md("""
## One slow worker paces sync SGD

Sync waits for every worker at every step, so the step time follows the slowest one.
Async does not wait: the other two workers go on at full speed.

Expect the sync step time to grow by a good part of the factor, not all of it: a step here is mostly
communication (a few milliseconds of round trips), which the pauses slow less than computation, and on a
machine with fewer cores than tasks the other workers get the CPU that the slowed one gives up.
"""),
    code("%tf_cluster slow worker:2 --factor 4"),
    code("""
slow_sync = tfmagic.train(cluster, mode="sync", steps=150, **opts)
slow_async = tfmagic.train(cluster, mode="async", steps=450, **opts)
print(f"sync step time with worker:2 at 1/4 speed: {step_time(slow_sync) / step_time(base_sync):.2f}x the unslowed step time")
print(f"async throughput with worker:2 at 1/4 speed: {total_rate(slow_async) / total_rate(base_async):.2f}x the unslowed throughput")
print(slow_async.summary())
"""),
    md("""
## Backup workers give sync its speed back

With `backup_workers=1`, each step aggregates the first 2 of 3 gradients; the straggler's gradient arrives late,
was computed from old parameters, and is dropped (and counted).
"""),
    code("""
backup = tfmagic.train(cluster, mode="sync", steps=150, backup_workers=1, **opts)
print(f"sync + 1 backup worker, worker:2 slowed: {step_time(backup) / step_time(base_sync):.2f}x the unslowed step time")
print("gradients dropped as stale, per worker:", backup.dropped())
print(f"held-out accuracy: {backup.final_accuracy:.3f} (no straggler: {base_sync.final_accuracy:.3f})")
"""),
    code("%tf_cluster slow worker:2 --factor 1"),
    md("""
## A worker dies during async training

Training runs in the background (`block=False`), so this notebook can kill a worker while it trains.
Async goes on with the other two; when the worker is restarted, it rejoins. A restart without a warm spare
starts a new process that imports TensorFlow's server core, which can take seconds on a busy machine, so the run is
given more steps than it needs
and stopped once worker 2 has been back at work for 100 steps.
"""),
    code("""
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
"""),
    md("""
## A worker dies during sync training

Without backup workers, sync SGD cannot make a step without every worker. tfmagic stops at once and says why,
instead of hanging.
"""),
    code("""
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
"""),
    md("""
## Watch it live

`%tf_train` trains in the background and shows the dashboard: throughput per worker (rolling over the
last seconds), loss per update and over time, and the cluster. While it runs, the next cell slows
worker 0: within a second its throughput line drops, and a mark shows when it happened.
"""),
    code("run = %tf_train --mode async --model digits --steps 2500 --lr 0.05"),
    code("""
while run.history.steps < 600:
    time.sleep(0.1)
%tf_cluster slow worker:0 --factor 4
"""),
    code("""
run.wait()
run.dashboard.wait(10)   # the last frame stays, also in the saved notebook
print(run.history.summary())
"""),
    code("%tf_cluster stop"),
]


from tfmagic.seeds import allreduce as _allreduce  # noqa: E402
from tfmagic.seeds import seed_000 as _seed_000  # noqa: E402

NB04 = [
    md("""
# 04 · Between-graph replication: the seeds' programs, from one notebook

Seed 003 names the two ways to replicate a model:

* **in-graph**: one client builds the whole computation and places its pieces on the tasks. That is what
  notebooks 01-03 did: this kernel was the client (`%%tf_device`, `tfmagic.train`).
* **between-graph**: every task runs *the same program*, with its own `job_name` and `task_index`, and builds
  its own graph. That is seed 000's `distribute.py`, typed once per machine, with output read from `ps0.out`,
  `worker0.out`, `worker1.out` afterwards.

`%%tf_px` makes that one cell: the cell's code runs inside every task. Each task finds `cluster`
(a `tf.train.ClusterSpec`), `job_name`, `task_index`, `server` (its own running server) and `TF_CONFIG`
ready, so the seeds' programs run with only their flag parsing and their `tf.train.Server(...)` line removed.
Output comes back live, each line prefixed with its task.
"""),
    code("""
%load_ext tfmagic
%tf_cluster start --ps 1 --workers 2
"""),
    code("""
%%tf_px
print(f"I am {job_name}:{task_index}, serving {server.target}; the cluster has {cluster.num_tasks('worker')} workers")
"""),
    md("""
## Seed 000, synchronous: `SyncReplicasOptimizer`

The program below is seed 000's, in TF1 style (`tf.compat.v1`): `replica_device_setter` puts the variables on
the ps and the ops on this worker; `SyncReplicasOptimizer(replicas_to_aggregate, total_num_replicas)` makes
the update synchronous (the chief runs the queue runner and the init tokens, through its session hook);
`MonitoredTrainingSession(master=server.target, is_chief=...)` runs it. The ps's `server.join()` returns at
once here (the ps keeps serving after the cell). The model is seed 004's line y = 2x + 10, each worker on its
own shard of tfmagic's `Linear` data; `report(step=..., loss=...)` feeds tfmagic's metrics.

Two tfmagic defaults keep this fast on one machine (documented in the README): non-chief sessions look for the
chief every second (TF: 30 s), and a session closes after 2 s even if the chief's queue runner still waits for
gradients (TF: 120 s).
"""),
    code("%%tf_px\n" + _seed_000(issync=True, steps=150).strip()),
    code("""
%%tf_px --targets worker:0 -o seed_sync
(float(final_w[0][0]), float(final_b[0]))
"""),
    md("""
### The same training, with this kernel as the client

`tfmagic.train` does in-graph what the program above did between-graph: same data shards, batch size, learning
rate and number of updates.
"""),
    code("""
import numpy as np
import tfmagic
from tfmagic.training.models import Linear

cluster = tfmagic.current_cluster()
data = Linear().data

def held_out(w, b):
    return float(np.mean((data.x_test * w + b - data.y_test) ** 2))

engine_sync = tfmagic.train(cluster, mode="sync", model=Linear(), steps=150, batch_size=16, lr=0.1)
w, b = seed_sync["worker:0"]
print(f"seed 000 sync (between-graph): w = {w:.4f}, b = {b:.4f}, held-out loss {held_out(w, b):.5f}")
print(f"kernel-driven sync (in-graph):  held-out loss {engine_sync.final_loss:.5f}")
"""),
    md("""
Both reach the noise floor of the data (its noise variance is 0.01). They are not identical step by step:
`SyncReplicasOptimizer` aggregates *any* two gradients per step (a fast worker may contribute twice), while
tfmagic's engine takes exactly one gradient per worker.

## Seed 000, asynchronous

The same program with `issync = False`: each worker applies its own gradients. A fresh cluster first, because
`SyncReplicasOptimizer` left its token queue on the ps.
"""),
    code("%tf_cluster start --ps 1 --workers 2 --replace"),
    code("%%tf_px\n" + _seed_000(issync=False, steps=150).strip()),
    code("""
%%tf_px --targets worker:0 -o seed_async
(float(final_w[0][0]), float(final_b[0]))
"""),
    md("""
## TF2's all-reduce: `MultiWorkerMirroredStrategy`

TF2 has no synchronous parameter-server training; its synchronous way is **all-reduce**: every worker holds a
copy of the variables and the workers average their updates among themselves, with no ps at all. The strategy
starts each task's server itself, so the cluster is started in **collective mode** (`--collective`, no ps):
every task then has the strategy ready as `strategy`.
"""),
    code("%tf_cluster start --workers 2 --collective --replace"),
    code("%%tf_px\n" + _allreduce(steps=150).strip()),
    code("""
%%tf_px --targets worker:0 -o allreduce_result
(float(final_w[0][0]), float(final_b[0]), allreduce_seconds)
"""),
    md("""
## What differs and why
"""),
    code("""
aw, ab, asecs = allreduce_result["worker:0"]
sw, sb = seed_sync["worker:0"]
yw, yb = seed_async["worker:0"]
rows = [
    ("all-reduce sync (MWMS, between-graph)", aw, ab),
    ("ps sync (seed 000, SyncReplicasOptimizer)", sw, sb),
    ("ps async (seed 000)", yw, yb),
]
for name, w, b in rows:
    print(f"{name:42s} w = {w:.4f}  b = {b:.4f}  held-out loss {held_out(w, b):.5f}")
print(f"{'kernel-driven sync (tfmagic.train)':42s} held-out loss {engine_sync.final_loss:.5f}")
"""),
    md("""
* **All-reduce sync** averages exactly one gradient per worker per step, like tfmagic's kernel-driven sync engine;
  with the same data and learning rate they compute the same weights (a test checks it to float tolerance).
* **ps sync** (`SyncReplicasOptimizer`) counts gradients, not workers: a step is taken when any
  `replicas_to_aggregate` gradients have arrived, and stale ones are dropped.
* **ps async** applies every gradient as it comes: no waiting, some staleness.
* Between-graph, each task builds its own graph and session; in-graph, one client drives all tasks. The first
  scales to many workers without a central client; the second is easier to watch and to steer from a notebook.
"""),
    code("%tf_cluster stop"),
]


NB05 = [
    md("""
# 05 · Beyond one machine: local, SSH and Spark, and what stays the same

The seeds' users outgrow one machine. Seed 000 and 002 type one command per host; seed 000 and 003 hand the
cluster to Spark/YARN through TensorFlowOnSpark. tfmagic launches the **same task process** on each of these
engines and keeps everything above it the same. This notebook trains one model, from the same initial weights
on the same data, on three backends:

| backend | how a task is started | what ties it to this kernel |
| --- | --- | --- |
| `local` | a spawned process on this machine | the pipe on its stdin: the kernel holds the only write end |
| `ssh` | `ssh HOST exec python -m tfmagic.task_main`, with your own ssh setup | the SSH session: it ends when the kernel goes, and the task reads end-of-file |
| `spark` | one Spark **barrier** task per TF task, relaying an authenticated socket to the kernel | the socket and the Spark job: a dead driver takes every task with it |

What changes: where the processes run, how long they take to come up, the addresses in the spec, and who
can reach the servers. What does not: the spec, `%%tf_device`, the training engine, the dashboard,
`slow`/`kill`/`restart`, the logs one command away.

In the test suite the SSH hosts are network namespaces with their own `sshd` (each its own address: "remote"
really is another address) and Spark runs in local mode. On your machines, set `TFMAGIC_DEMO_SSH_HOSTS`
(comma-separated hosts your `ssh` reaches without a password) before starting the kernel.
"""),
    code("""
import os, sys, time
import tfmagic
%load_ext tfmagic

SSH_HOSTS = os.environ.get("TFMAGIC_DEMO_SSH_HOSTS", "")
SSH_CONFIG = os.environ.get("TFMAGIC_DEMO_SSH_CONFIG", "")
PYTHON = os.environ.get("TFMAGIC_DEMO_PYTHON", sys.executable)
results = {}

def train_here(backend):
    \"\"\"The same run on whatever cluster is current: sync SGD, linear model, seed 0.\"\"\"
    cluster = tfmagic.current_cluster()
    h = tfmagic.train(cluster, mode="sync", model="linear", steps=60, batch_size=16, lr=0.1, seed=0)
    rate = sum(r["steps_per_s"] for r in h.throughput().values())
    results[backend] = dict(start_s=cluster.last_outcome.seconds, loss=h.final_loss, steps_per_s=rate,
                            spec=cluster.cluster_def.as_dict())
    print(f"{backend}: final held-out loss {h.final_loss:.6f} after {len(h.global_steps)} updates; "
          f"{rate:.0f} worker steps/s")
"""),
    md("""
## 1 · SSH: tasks on other hosts, with your own ssh

`--hosts` takes what your `ssh` understands (aliases from `~/.ssh/config`, `user@host`). Tasks are placed
round-robin: `ps:0` on the first host, `worker:0` on the second, and so on. Each server is kept on its spec
address only (a small bind library built on each host), and `start` says plainly who can still reach it;
`--tunnel` keeps the servers on each host's loopback and carries all traffic through SSH tunnels instead.
"""),
    code("""
if SSH_HOSTS:
    config = f"--ssh-config {SSH_CONFIG}" if SSH_CONFIG else ""
    %tf_cluster start --backend ssh --hosts {SSH_HOSTS} --python {PYTHON} {config} --ps 1 --workers 2
else:
    print("No SSH hosts given (TFMAGIC_DEMO_SSH_HOSTS): skipping the SSH backend.")
"""),
    md("`status` shows where each task runs (the `host` column) and measures each task on its own host:"),
    code("""
if SSH_HOSTS:
    %tf_cluster status
"""),
    md(
        "The log of a remote task comes back over its SSH session, so it is one command away as for a local one:"
    ),
    code("""
if SSH_HOSTS:
    %tf_cluster logs worker:0 --tail 3
"""),
    md("A straggler on a remote host works the same way: the task slows itself down, on its own host."),
    code("""
if SSH_HOSTS:
    %tf_cluster slow worker:1 --factor 4
    t0 = time.perf_counter()
    with tfmagic.current_cluster().device("worker:1"):
        import tensorflow as tf
        for _ in range(20):
            tf.reduce_sum(tf.ones([200, 200]) @ tf.ones([200, 200])).numpy()
    print(f"20 small ops on the slowed worker:1 took {time.perf_counter() - t0:.2f} s")
    %tf_cluster slow worker:1 --factor 1
"""),
    code("""
if SSH_HOSTS:
    train_here("ssh")
    %tf_cluster stop
"""),
    md("## 2 · Local: every task a process on this machine"),
    code("%tf_cluster start --ps 1 --workers 2 --no-spares"),
    code("""
train_here("local")
%tf_cluster stop
"""),
    md("""
## 3 · Spark: each task a barrier-mode Spark task

`--backend spark --master local[3]` (or `spark://HOST:PORT`) submits one Spark job with one barrier task per TF
task. The application shows in the Spark UI; stopping the cluster ends the job.
"""),
    code("""
try:
    import pyspark  # noqa: F401
    HAVE_SPARK = True
except ImportError:
    HAVE_SPARK = False
    print("pyspark is not installed (pip install 'tfmagic[spark]'): skipping the Spark backend.")
if HAVE_SPARK:
    %tf_cluster start --backend spark --master local[3] --ps 1 --workers 2
"""),
    code("""
if HAVE_SPARK:
    %tf_cluster status
    train_here("spark")
    %tf_cluster stop
"""),
    md("""
## What changed, and what did not

Every run started from the same weights (seed 0) and fed each worker the same shard of the same data. Sync SGD
with all workers taking part computes exactly what one process would, so the **final loss is the same on every
backend**, while the start time and the step rate show what the engine and the network cost:
"""),
    code("""
base = results["local"]
print(f"{'backend':8s} {'start s':>8s} {'/ local':>8s} {'steps/s':>8s} {'final loss':>12s}  addresses")
for name, r in results.items():
    hosts = sorted({a.rsplit(':', 1)[0] for addrs in r["spec"].values() for a in addrs})
    print(f"{name:8s} {r['start_s']:8.1f} {r['start_s'] / base['start_s']:8.2f} {r['steps_per_s']:8.0f} "
          f"{r['loss']:12.6f}  {', '.join(hosts)}")
same = all(abs(r["loss"] - base["loss"]) < 1e-4 for r in results.values())
print("same final loss on every backend:", same)
"""),
    md("""
## Engines we cannot run here: Slurm and Kubernetes

The same cluster description exports to a Slurm batch script (read back by TensorFlow's
`SlurmClusterResolver`) and to Kubernetes manifests (a Service and a Pod per task, each Pod with its
`TF_CONFIG`). They are validated by the tests, not run on a real Slurm or Kubernetes cluster.
"""),
    code("%tf_cluster export slurm --ps 1 --workers 2"),
    md("""
## Attach: a cluster someone else started

`%tf_cluster attach` takes a ClusterSpec or a `TF_CONFIG` (JSON, a file, or `$TF_CONFIG`) and makes this kernel
its client. tfmagic did not start those tasks, so `stop` only detaches and `kill` refuses. Here the "someone
else" is a script-style cluster started with the plain API:
"""),
    code("""
import json
other = tfmagic.LocalCluster(ps=1, workers=1, spares=False).__enter__()
spec = json.dumps(other.cluster_def.as_dict())
%tf_cluster attach {spec!r}
"""),
    code("""
%%tf_device worker:0
print("computed on", tf.reduce_sum(tf.ones(4)).device)
"""),
    code("""
%tf_cluster stop
print("the attached tasks still run:", all(p.alive for p in other.procs.values()))
other.stop()
"""),
]


def write(name: str, cells) -> Path:
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = HERE / name
    nbformat.write(nb, path)
    return path


NOTEBOOKS = {
    "01_cluster_basics.ipynb": NB01,
    "02_sync_vs_async.ipynb": NB02,
    "03_stragglers_and_failures.ipynb": NB03,
    "04_between_graph.ipynb": NB04,
    "05_beyond_one_machine.ipynb": NB05,
}


def execute(path: Path) -> None:
    """Run a written notebook in a fresh kernel and save it with its outputs."""
    import os

    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    env = dict(os.environ, TFMAGIC_SPARES="0")
    NotebookClient(
        nb,
        timeout=900,
        kernel_name="python3",
        store_widget_state=True,
        resources={"metadata": {"path": str(HERE)}},
    ).execute(env=env)
    nbformat.write(nb, path)


if __name__ == "__main__":
    args = sys.argv[1:]
    run = "--execute" in args
    names = [a for a in args if not a.startswith("--")] or list(NOTEBOOKS)
    for name in names:
        path = write(name, NOTEBOOKS[name])
        if run:
            execute(path)
        print("wrote", path, "(executed)" if run else "")
