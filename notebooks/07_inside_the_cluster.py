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
# # 07 · Inside the cluster: where variables live, what moves, who waits
#
# Seed article 002 reads `ps0.out` and `worker0.out` to find out whether the nodes really
# cooperated. Here you look inside while it runs:
#
# 1. **the placement map**: every variable, on which task, and each ps's share of the bytes;
# 2. **traffic, measured**: bytes on every link, from the operating system's TCP counters;
# 3. **the ps bottleneck**: a modelled network card on the ps, and what a second ps shard does;
# 4. **the hang doctor**: who waits on whom, and why, while something is stuck.
#
# ```
#                 kernel (the client: %tf_train, %%tf_device)
#                /        |         \
#          worker:0    worker:1    ...        each step: read every parameter from the ps,
#                \        |        /          write a gradient of the same size back
#                 ps:0  (ps:1 ...)            the variables live here
# ```
#
# **Predict before you run each part**; the questions are in bold.

# %%
# %load_ext tfmagic
import tfmagic
from tfmagic import lesson, session

# %% [markdown]
# ## 1 · The placement map
# A cluster with **two** ps, and a run of the digits classifier (64 → 32 → 10). The engine places the
# model's variables round-robin over the ps tasks in the order the model makes them.
#
# **Predict:** which ps holds `hidden/kernel` (64 × 32 floats), and what share of the bytes does it hold?

# %%
# %tf_cluster start --ps 2 --workers 2
# %tf_train --mode async --steps 200 --model digits --wait
# %tf_cluster map

# %%
shares = tfmagic.current_cluster().placement().shares()
lesson.expect(max(shares.values()), at_least=0.9, claim="one ps holds nearly all the bytes")

# %% [markdown]
# Round-robin by order is not round-robin by size: one ps holds nearly all the bytes, and the map
# says so. Every worker reads and writes there each step, so that ps's network card is the
# bottleneck. The `steps run` line is the proof that both workers cooperated: each ran its share.
#
# ## 2 · Traffic, measured
# The bytes each process sent to each other process since the cluster started, read from the
# kernel's TCP counters (`ss`), not estimated from tensor sizes.
#
# **Predict:** per step, a worker reads all 2,410 parameters (9.6 kB) and writes a gradient of the
# same size. About how many bytes should the two workers have sent to the ps after the run above?

# %%
cluster = tfmagic.current_cluster()
history = session.default().last_run.history
t = cluster.traffic()
print(t)
to_ps = sum(r["bytes"] for r in t if r["src"].startswith("worker") and r["dst"].startswith("ps"))
steps = len(history.records)
print(f"\nworkers -> ps: {to_ps / 1e6:.2f} MB over {steps} steps = {to_ps / steps / 1e3:.1f} kB per step")
print("the model's gradient: 2,410 floats = 9.6 kB per step (the rest: gRPC framing, the step's calls)")
overhead = to_ps / steps / 9640
lesson.expect(
    overhead,
    between=(1.0, 2.0),
    claim="the workers sent the gradients plus gRPC's framing, less than twice them",
)
lesson.say(f"Here the measured bytes were **{(overhead - 1) * 100:.0f} %** more than the gradients.")

# %% [markdown]
# gRPC adds framing and each call carries its own small messages, so with a model this small the
# measured bytes are tens of percent more than the gradient (above); with a model of 300k parameters (1.2 MB)
# the framing is lost in the tensor, and the tests check the measured bytes against the model's
# within 30 %.
#
# ## 2½ · When a worker dies: the proof of cooperation, live
# Seed article 002 asks whether the nodes really cooperated. Each worker's steps and the bytes it
# moved to and from the ps answer it; so does what happens to those numbers when one worker is
# killed in the middle of an asynchronous run.
#
# **Predict:** three seconds before and three seconds after `worker:1` is killed: which numbers
# keep growing, which stop, and does the run stop?

# %%
import time


def cooperation(run):
    """Per worker: the steps it ran in this run, and the bytes it sent to / received from the ps."""
    t = cluster.traffic()
    rows = {}
    for w in ("worker:0", "worker:1"):
        steps = sum(1 for r in run.history.records if str(r.task) == w)
        sent = sum(r["bytes"] for r in t if r["src"] == w and r["dst"].startswith("ps"))
        got = sum(r["bytes"] for r in t if r["dst"] == w and r["src"].startswith("ps"))
        rows[w] = (steps, sent, got)
    return rows


run = tfmagic.train(cluster, mode="async", model="digits", steps=100_000, block=False)
time.sleep(4)
before = cooperation(run)
# %tf_cluster kill worker:1
killed_at = time.time()  # the kill has returned: worker:1's process is gone
time.sleep(4)
after = cooperation(run)
print(f"{'':9s} {'steps':>14s} {'sent to ps':>20s} {'received from ps':>22s}")
for w in before:
    (s0, a0, b0), (s1, a1, b1) = before[w], after[w]
    print(
        f"{w:9s} {s0:6d} -> {s1:6d} {a0 / 1e6:8.2f} -> {a1 / 1e6:6.2f} MB {b0 / 1e6:9.2f} -> {b1 / 1e6:6.2f} MB"
    )
print("the run is", "still training" if run.running else "stopped", f"({run.history.steps} updates)")
late = [r for r in run.history.records if str(r.task) == "worker:1" and r.start > killed_at]
lesson.expect(not late, claim="the dead worker started no step after the kill: its numbers froze")
lesson.expect(
    after["worker:0"][0] - before["worker:0"][0], at_least=10, claim="the other worker's steps kept growing"
)
lesson.expect(after["worker:0"][1] > before["worker:0"][1], claim="and so did the bytes it sent to the ps")
lesson.expect(run.running, claim="the asynchronous run went on without the dead worker")
run.stop()
# %tf_cluster restart worker:1

# %% [markdown]
# The dead worker's numbers freeze at what it did before it died; the other worker's keep growing,
# and the asynchronous run goes on without it (a synchronous one would stop and say why, notebook 03).
# Nothing is lost: every update either worker applied is still on the ps.
#
# ## 3 · The parameter-server bottleneck
# Loopback moves gigabytes a second, so on one machine the ps is never the bottleneck. A **modelled
# network card** makes it one: `--net "ps:* rate=50mbit"` puts each ps behind a relay that passes
# 50 Mbit/s each way (no root needed). The experiment `ps-bottleneck` trains a model of 1M
# parameters (4 MB read and 4 MB written per step) with one ps, then with two.
#
# **Predict:** with one ps at 50 Mbit/s (6.25 MB/s each way), how long does an update's
# communication take? And with two ps, each with its own card?

# %%
import tfmagic.experiments as experiments

# %tf_cluster stop
bottleneck = experiments.run("ps-bottleneck", seed=0)
print(bottleneck)
lesson.expect(bottleneck.holds, claim="a second ps shard halves an update's time on a saturated card")

# %% [markdown]
# 4 MB at 6.25 MB/s is 0.64 s per update with one ps; two shards carry 2 MB each, in parallel.
# You can shape a running cluster's cards live too: `%tf_cluster net ps:0 --rate 50mbit --delay 2ms`.
#
# ## 4 · The hang doctor
# A sync step waits for every worker. Stop one with SIGSTOP (as a crashed VM or a full disk would)
# and ask why nothing moves.
#
# **Predict:** what will the doctor name as the cause, and what should you do next?

# %%
import os
import signal
import time

# %tf_cluster start --ps 1 --workers 2
run = tfmagic.train(tfmagic.current_cluster(), mode="sync", steps=100_000, model="digits", block=False)
while len(run.history.records) < 40:  # past its warm-up, stepping
    time.sleep(0.2)
stuck = tfmagic.current_cluster().procs["worker:1"]
os.kill(stuck.task_pid, signal.SIGSTOP)
time.sleep(3)

# %%
# %tf_cluster why

# %%
lesson.expect(
    tfmagic.current_cluster().condition("worker:1").startswith("stopped"),
    claim="the doctor's cause: worker:1 is stopped",
)

# %%
os.kill(stuck.task_pid, signal.SIGCONT)
run.stop()
print(run)
# %tf_cluster stop
lesson.summary()

# %% [markdown]
# The doctor reads what tfmagic knows: which calls wait on which task (the engine, cells and starts
# note each wait), each task's process state, its channel and its log. `--stacks` adds every task's
# Python stacks, collected over tfmagic's own channel.
#
# ## Exercises
# 1. Start `--ps 2` and train `tfmagic.training.models.Digits(hidden=4096)` (300k parameters). Compare
#    `cluster.traffic()` per step with the model's size. Which ps carries the traffic, and why?
# 2. In the bottleneck experiment, what would four ps shards give, and when does adding shards stop
#    helping? (Hint: what else does an update cost when the network is fast?)
# 3. Run a `%%tf_px --targets worker:1` cell with a TF1 `MonitoredTrainingSession(is_chief=False)` and
#    no chief. What does `%tf_cluster why` say? What does TensorFlow itself print, and after how long?
#
# <details><summary>Solutions (click to open)</summary>
#
# 1. The model has 64 × 4096 + 4096 + 4096 × 10 + 10 = 307,210 parameters, 1.2 MB in float32. The engine puts
#    variables on the ps round-robin in the order the model makes them, so `hidden/kernel` (1 MB) and
#    `output/kernel` land on ps:0 and the two biases on ps:1: `cluster.placement()` said ps:0 holds 99 % of
#    the ps bytes and named `hidden/kernel` as the bottleneck. In one run of 60 async updates, ps:0 sent each
#    worker about 37 MB and received as much (about 1.2 MB each way per step: a read of every parameter and a
#    gradient of the same size), ps:1 about half a megabyte. A second ps helps only when the bytes are spread:
#    split the big matrix, or order the variables so each ps gets its share.
# 2. Four shards of the four equal blocks carry 1 MB each, in parallel: a quarter of one ps's communication
#    time (0.16 s against 0.64 s per update at 50 Mbit/s), if each shard has its own card. Shards stop helping
#    when the communication time falls below the rest of an update: the worker's compute, the calls' round
#    trips, the apply, and the worker's own card, which carries every byte of every shard. With four blocks a
#    fifth shard would hold nothing at all.
# 3. The doctor names it once the cell has waited (here after 45 s): "a TF1 non-chief session waits for the
#    chief to initialise the variables, and the chief is not running this program. Next: run the program on
#    the chief too (is_chief=True, usually worker:0): --targets worker:*". TensorFlow's own log
#    (`%tf_cluster logs worker:1 --all`) repeats `Waiting for model to be ready. Ready_for_local_init_op: ...,
#    ready: ...` at every check (every 30 s in plain TensorFlow; tfmagic checks every 0.1 s, so the log fills
#    fast), and the session gives up only after `max_wait_secs=7200`: two hours later, with
#    `DeadlineExceededError: Session was not ready after waiting 7200 secs`.
#
# </details>
