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
# # 05 · Beyond one machine: local, SSH and Spark, and what stays the same
#
# **What you will learn** (about 20 minutes)
#
# 1. how the same task process is started by three engines (a local process, `ssh`, a Spark barrier task),
#    and what ties each one to this kernel so that nothing outlives it;
# 2. what changes from one backend to another (start time, addresses, who can reach the servers) and
#    what does not (the spec, placement, training, the results);
# 3. to attach to a cluster someone else started, and what tfmagic then refuses to do to it;
# 4. how the same cluster description becomes a Slurm script or Kubernetes manifests.
#
# ```text
#   this kernel ──pipe──► local task process          (same machine)
#               ──ssh───► python -m tfmagic.task_main (on node1, node2, ...)
#               ──Spark─► barrier task ─relay─► task  (one Spark job, a task per TF task)
#   every task: the same tf.distribute.Server, the same spec, the same %%tf_device
# ```
#
# The source articles' users outgrow one machine. Articles 000 and 002 type one command per host; articles 000 and 003 hand the
# cluster to Spark/YARN through TensorFlowOnSpark. tfmagic launches the **same task process** on each of these
# engines and keeps everything above it the same. This notebook trains one model, from the same initial weights
# on the same data, on three backends:
#
# | backend | how a task is started | what ties it to this kernel |
# | --- | --- | --- |
# | `local` | a spawned process on this machine | the pipe on its stdin: the kernel holds the only write end |
# | `ssh` | `ssh HOST exec python -m tfmagic.task_main`, with your own ssh setup | the SSH session: it ends when the kernel goes, and the task reads end-of-file |
# | `spark` | one Spark **barrier** task per TF task, relaying an authenticated socket to the kernel | the socket and the Spark job: a dead driver takes every task with it |
#
# What changes: where the processes run, how long they take to come up, the addresses in the spec, and who
# can reach the servers. What does not: the spec, `%%tf_device`, the training engine, the dashboard,
# `slow`/`kill`/`restart`, the logs one command away.
#
# In the test suite the SSH hosts are network namespaces with their own `sshd` (each its own address: "remote"
# really is another address) and Spark runs in local mode. On your machines, set `TFMAGIC_DEMO_SSH_HOSTS`
# (comma-separated hosts your `ssh` reaches without a password) before starting the kernel.

# %%
# %load_ext tfmagic
import os, sys, time
import tensorflow as tf  # the %%tf_device cells below use it, whichever backends run here
import tfmagic
from tfmagic import lesson

SSH_HOSTS = os.environ.get("TFMAGIC_DEMO_SSH_HOSTS", "")
SSH_CONFIG = os.environ.get("TFMAGIC_DEMO_SSH_CONFIG", "")
PYTHON = os.environ.get("TFMAGIC_DEMO_PYTHON", sys.executable)
results = {}

def train_here(backend):
    """The same run on whatever cluster is current: sync SGD, linear model, seed 0."""
    cluster = tfmagic.current_cluster()
    h = tfmagic.train(cluster, mode="sync", model="linear", steps=60, batch_size=16, lr=0.1, seed=0)
    rate = sum(r["steps_per_s"] for r in h.throughput().values())
    results[backend] = dict(start_s=cluster.last_outcome.seconds, loss=h.final_loss, steps_per_s=rate,
                            spec=cluster.cluster_def.as_dict())
    print(f"{backend}: final held-out loss {h.final_loss:.6f} after {len(h.global_steps)} updates; "
          f"{rate:.0f} worker steps/s")


# %% [markdown]
# ## 1 · SSH: tasks on other hosts, with your own ssh
#
# `--hosts` takes what your `ssh` understands (aliases from `~/.ssh/config`, `user@host`). Tasks are placed
# round-robin: `ps:0` on the first host, `worker:0` on the second, and so on. Each server is kept on its spec
# address only (a small bind library built on each host), and `start` says plainly who can still reach it;
# `--tunnel` keeps the servers on each host's loopback and carries all traffic through SSH tunnels instead.

# %%
if SSH_HOSTS:
    config = f"--ssh-config {SSH_CONFIG}" if SSH_CONFIG else ""
    # %tf_cluster start --backend ssh --hosts {SSH_HOSTS} --python {PYTHON} {config} --ps 1 --workers 2
else:
    print("No SSH hosts given (TFMAGIC_DEMO_SSH_HOSTS): skipping the SSH backend.")

# %% [markdown]
# `status` shows where each task runs (the `host` column) and measures each task on its own host:

# %%
if SSH_HOSTS:
    # %tf_cluster status

# %% [markdown]
# The log of a remote task comes back over its SSH session, so it is one command away as for a local one:

# %%
if SSH_HOSTS:
    # %tf_cluster logs worker:0 --tail 3

# %% [markdown]
# A straggler on a remote host works the same way: the task slows itself down, on its own host.

# %%
if SSH_HOSTS:
    # %tf_cluster slow worker:1 --factor 4
    t0 = time.perf_counter()
    with tfmagic.current_cluster().device("worker:1"):
        import tensorflow as tf
        for _ in range(20):
            tf.reduce_sum(tf.ones([200, 200]) @ tf.ones([200, 200])).numpy()
    print(f"20 small ops on the slowed worker:1 took {time.perf_counter() - t0:.2f} s")
    # %tf_cluster slow worker:1 --factor 1

# %%
if SSH_HOSTS:
    train_here("ssh")
    # %tf_cluster stop

# %% [markdown]
# ## 2 · Local: every task a process on this machine

# %%
# %tf_cluster start --ps 1 --workers 2 --no-spares

# %%
train_here("local")
# %tf_cluster stop

# %% [markdown]
# ## 3 · Spark: each task a barrier-mode Spark task
#
# `--backend spark --master local[3]` (or `spark://HOST:PORT`) submits one Spark job with one barrier task per TF
# task. The application shows in the Spark UI; stopping the cluster ends the job.

# %%
try:
    import pyspark  # noqa: F401
    HAVE_SPARK = True
except ImportError:
    HAVE_SPARK = False
    print("pyspark is not installed (pip install 'tfmagic[spark]'): skipping the Spark backend.")
if HAVE_SPARK:
    # %tf_cluster start --backend spark --master local[3] --ps 1 --workers 2

# %%
if HAVE_SPARK:
    # %tf_cluster status
    train_here("spark")
    # %tf_cluster stop

# %% [markdown]
# ## What changed, and what did not
#
# **Predict:** every run started from the same weights (seed 0) and fed each worker the same shard of the
# same data. Will the final losses be equal on every backend, or only close? And which backend starts
# fastest?
#
# Sync SGD with all workers taking part computes exactly what one process would, so the **final loss is
# the same on every backend**, while the start time and the step rate show what the engine and the network
# cost:

# %%
base = results["local"]
print(f"{'backend':8s} {'start s':>8s} {'/ local':>8s} {'steps/s':>8s} {'final loss':>12s}  addresses")
for name, r in results.items():
    hosts = sorted({a.rsplit(':', 1)[0] for addrs in r["spec"].values() for a in addrs})
    print(f"{name:8s} {r['start_s']:8.1f} {r['start_s'] / base['start_s']:8.2f} {r['steps_per_s']:8.0f} "
          f"{r['loss']:12.6f}  {', '.join(hosts)}")
if len(results) > 1:
    same = all(abs(r["loss"] - base["loss"]) < 1e-4 for r in results.values())
    print(f"same final loss on every backend ({', '.join(results)}):", same)
    lesson.expect(same, claim=f"the final loss is the same on every backend that ran ({', '.join(results)})")
else:
    print("only the local backend ran here (no SSH hosts given, no pyspark): nothing to compare it with;"
          " on Binder that is expected, on your machines set TFMAGIC_DEMO_SSH_HOSTS")

# %% [markdown]
# ## Engines we cannot run here: Slurm and Kubernetes
#
# The same cluster description exports to a Slurm batch script (read back by TensorFlow's
# `SlurmClusterResolver`) and to Kubernetes manifests (a Service and a Pod per task, each Pod with its
# `TF_CONFIG`). They are validated by the tests, not run on a real Slurm or Kubernetes cluster.

# %%
from tfmagic.export import export

script = export("slurm", tfmagic.ClusterShape(ps=1, workers=2))  # what `%tf_cluster export slurm` prints
lines = script.splitlines()
print("\n".join(lines[:16]))
print(f"... and {len(lines) - 16} more lines: the launcher each Slurm task runs (`%tf_cluster export slurm` prints all)")

# %% [markdown]
# ## Attach: a cluster someone else started
#
# `%tf_cluster attach` takes a ClusterSpec or a `TF_CONFIG` (JSON, a file, or `$TF_CONFIG`) and makes this kernel
# its client. tfmagic did not start those tasks, so `stop` only detaches and `kill` refuses. Here the "someone
# else" is a script-style cluster started with the plain API:

# %%
import json
other = tfmagic.LocalCluster(ps=1, workers=1, spares=False).__enter__()
spec = json.dumps(other.cluster_def.as_dict())
# %tf_cluster attach {spec!r}

# %%
# %%tf_device worker:0
print("computed on", tf.reduce_sum(tf.ones(4)).device)

# %%
# %tf_cluster stop
print("the attached tasks still run:", all(p.alive for p in other.procs.values()))
lesson.expect(all(p.alive for p in other.procs.values()), claim="stop only detached: the attached tasks still run")
other.stop()
lesson.summary()

# %% [markdown]
# ## Exercises
#
# 1. Which addresses does `%tf_cluster spec` show for the local cluster, and why could a task on another
#    machine not use them?
# 2. `%tf_cluster export k8s --ps 1 --workers 2 --image python:3.11` prints manifests. Find each task's
#    `TF_CONFIG` in them: how does `worker:1` learn the address of `ps:0` in Kubernetes?
# 3. In the attach section, before `%tf_cluster stop`, try `%tf_cluster kill worker:0` on the attached
#    cluster. What does tfmagic answer, and why is that the right answer?
# 4. The comparison table shows steps per second per backend. On one machine, why can the SSH backend
#    not be faster than the local one, even though the tasks are the same?
#
# <details><summary>Solutions (click to open)</summary>
#
# 1. `127.0.0.1:PORT` for every task: local tasks listen on loopback only, which no other machine can
#    reach. The SSH backend uses each host's own address in the spec instead (or loopback plus tunnels
#    with `--tunnel`).
# 2. Each task gets a headless Service named after it (`tfmagic-ps-0`, `tfmagic-worker-1`, ...), and every
#    Pod's `TF_CONFIG` lists the tasks by those names (`"ps": ["tfmagic-ps-0:2222"]`): `worker:1` reaches
#    `ps:0` through the cluster's DNS, whatever node its Pod landed on.
# 3. It refuses, in one line: tfmagic did not start those processes, so it does not kill them (`stop`
#    only detaches). Someone else owns them; killing them could end their work.
# 4. The same processes do the same work on the same cores; SSH only adds its session (and, with
#    namespace hosts, a virtual network) between the kernel and the tasks. The table shows what that
#    costs, not a speed-up.
#
# </details>

