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
# # 02 · Sync vs async training
#
# Article 001 states the trade-off this notebook measures on a real cluster:
#
# * **synchronous SGD**: every step, each worker computes a gradient from the *same* parameters; the gradients
#   are averaged and applied once. Each update waits for the slowest worker.
# * **asynchronous SGD** (Downpour): each worker applies its gradient as soon as it has one. Nobody waits, but a
#   worker's gradient may have been computed from parameters that others have changed meanwhile: it is **stale**.
#
# **What this notebook shows:** the two loops as tfmagic runs them (the code itself), what each does to the
# workers' time (a Gantt strip: who computes, who waits), how many updates per second each makes, how far the
# held-out loss falls per update, per example and per second, and how stale async's gradients are.
#
# The cluster is **paced** (`--pace auto`): each worker is a modelled machine whose step takes the same time P,
# whatever this laptop's two cores are doing (the engine waits out the rest of each step). `auto` picks P by
# measuring what this machine keeps for three workers; the start below prints it (call it P in your answers).
# Without a pace, four processes sharing two cores teach the laptop, not the algorithm.
#
# ## Predict first
#
# Write your answers down before you run the cells. Three workers, each step P (as the start prints it):
#
# 1. How many updates per second does sync make? And async?
# 2. Per **update**, which mode lowers the held-out loss more? Per **example** the workers read? Per **second**?
# 3. While an async worker computes its gradient, the other workers apply theirs. How stale is a gradient, on
#    average?

# %%
# %load_ext tfmagic
# %tf_cluster start --ps 1 --workers 3 --pace auto

# %% [markdown]
# Both runs below start from the same initial weights and train the same model (a small MLP on the UCI
# handwritten digits that ship with tfmagic, batch 32 per worker step) on the same data shards, for the
# same number of updates.
# Every few updates each run measures the loss on the **same 256 held-out examples**: the one measure both modes
# share (a sync update's own loss averages three batches, an async one's is one batch).

# %%
import inspect
from collections import Counter

from IPython.display import Image

import tfmagic
from tfmagic import lesson, plots
from tfmagic.training.asynchronous import AsyncLoop
from tfmagic.training.sync import SyncLoop

cluster = tfmagic.current_cluster()
P = cluster.pace.base * 1000  # the modelled step time auto measured, in ms
comp = tfmagic.compare(cluster, model="digits", steps=300, lr=0.1, batch_size=32)
sync, async_ = comp.histories
print(comp.table())
for h in comp.histories:  # a machine too busy to keep the pace says so here
    for note in h.notes:
        print(f"{h.run}: {note}")
missed = [h.run for h in comp.histories if any("could not keep" in n for n in h.notes)]
lesson.expect(not missed, claim=f"the machine kept the {P:.0f} ms pace, so these runs show the model")

# %% [markdown]
# ## The sync loop
#
# This is tfmagic's own code (`SyncLoop.run`, then the worker's side, `SyncLoop.work`): for each step `t`, tell
# the workers to read the parameters, collect the first `workers - backup_workers` gradients of step `t`,
# average and apply them, record. Each worker's thread waits for a new step, computes its gradient in one call to
# its task and, on a paced cluster, waits out its modelled step.

# %%
print(inspect.getsource(SyncLoop.run))
print(inspect.getsource(SyncLoop.work))

# %% [markdown]
# What it does to the workers' time, over the last ten updates: each worker computes its step (blue); nobody starts
# step `t + 1` before every gradient of step `t` is in and applied (the thin gaps). With three identical machines
# they finish together, so hardly anyone waits.

# %%
Image(plots.png_bytes(plots.gantt_figure(sync, steps=10)))

# %%
for task, row in sorted(plots.gantt_shares(sync).items()):
    print(f"sync  {task}: busy {row['busy']:.0%}, waiting at the barrier {row['wait']:.0%}")
lesson.expect(
    max(row["wait"] for row in plots.gantt_shares(sync).values()),
    at_most=0.1,
    claim="with identical machines hardly anyone waits at the barrier",
)

# %% [markdown]
# ### Real machines are not identical
#
# Give each step a random spread of about 30 % (`jitter`: the same mean, P) and predict: does a sync update
# still take P? Each update now lasts as long as the *slowest* of three draws, and whoever drew a short step
# waits at the barrier (yellow).

# %%
cluster.pace.jitter = 0.3  # each modelled step now takes P x a random factor of mean 1
jittery = tfmagic.train(cluster, mode="sync", model="digits", steps=80, lr=0.1, batch_size=32)
cluster.pace.jitter = 0.0
print(
    f"sync with jitter: {jittery.median_step_time() * 1000:.0f} ms per update (median), "
    f"without: {sync.median_step_time() * 1000:.0f} ms"
)
for task, row in sorted(plots.gantt_shares(jittery).items()):
    print(f"jittery sync {task}: busy {row['busy']:.0%}, waiting at the barrier {row['wait']:.0%}")
lesson.expect(
    jittery.median_step_time() / sync.median_step_time(),
    at_least=1.1,
    claim=f"with jitter a sync update lasts longer than {P:.0f} ms: it waits for the slowest of three draws",
)
lesson.expect(
    max(row["wait"] for row in plots.gantt_shares(jittery).values()),
    at_least=0.05,
    claim="and whoever drew a short step waits at the barrier",
)
Image(
    plots.png_bytes(
        plots.gantt_figure(jittery, steps=10, title="sync with jitter: each worker's last 10 steps")
    )
)

# %% [markdown]
# ## The async loop
#
# `AsyncLoop.work`, one thread per worker: step as fast as this worker can (its modelled machine, when paced).
# Each call makes a step on the worker (read the parameters, compute, apply to the ps); the rest is bookkeeping
# (the step records come back several at a time, a paced step's gradient lands at its end).

# %%
print(inspect.getsource(AsyncLoop.work))

# %%
Image(plots.png_bytes(plots.gantt_figure(async_, steps=10)))

# %%
for task, row in sorted(plots.gantt_shares(async_).items()):
    print(f"async {task}: busy {row['busy']:.0%}, waiting {row['wait']:.0%}")

# %% [markdown]
# ## A fair comparison: per update, per example, per second
#
# The held-out loss of both runs against three x axes. Time starts at the end of each run's **warm-up** (tracing
# its functions, first connections: the table shows it apart; it is not the algorithm).

# %%
Image(plots.png_bytes(plots.convergence_figure(comp.histories)))


# %%
def held_out_at(h, x, value):
    """The held-out loss of the last probe at or before ``value`` on axis ``x``."""
    xs, ys = plots.held_out_curve(h, x)
    before = [y for x_, y in zip(xs, ys) if x_ <= value]
    return before[-1] if before else float("nan")


ups = sync.updates_per_s(), async_.updates_per_s()
print(
    f"updates per second: sync {ups[0]:.1f}, async {ups[1]:.1f} "
    f"-> async applies {ups[1] / ups[0]:.2f}x as many updates per second (3 workers)"
)
print(
    f"examples consumed for {sync.steps} updates: sync {sync.examples_seen()}, async {async_.examples_seen()}"
)
last = max(x for x in plots.held_out_curve(async_, "updates")[0])
print(
    f"held-out loss after {last} updates: sync {held_out_at(sync, 'updates', last):.3f}, "
    f"async {held_out_at(async_, 'updates', last):.3f}"
)
seen = async_.examples_seen()
print(
    f"held-out loss after {seen} examples: sync {held_out_at(sync, 'examples', seen):.3f}, "
    f"async {held_out_at(async_, 'examples', seen):.3f}"
)
secs = max(plots.held_out_curve(async_, "seconds")[0])
print(
    f"held-out loss after {secs:.1f} s of training: sync {held_out_at(sync, 'seconds', secs):.3f}, "
    f"async {held_out_at(async_, 'seconds', secs):.3f}"
)
print(f"accuracy at the end: sync {sync.final_accuracy:.3f}, async {async_.final_accuracy:.3f}")
lesson.expect(ups[1] / ups[0], between=(2.4, 3.6), claim="async makes about three updates for each of sync's")
lesson.expect(
    sync.examples_seen() == 3 * async_.examples_seen(), claim="sync reads three batches per update, async one"
)
per_update = held_out_at(async_, "updates", last) / held_out_at(sync, "updates", last)
lesson.expect(per_update, between=(0.75, 1.33), claim="per update the two curves are close")
lesson.expect(
    held_out_at(async_, "examples", seen) / held_out_at(sync, "examples", seen),
    at_most=0.8,
    claim="per example async is far ahead",
)
lesson.expect(
    held_out_at(async_, "seconds", secs) / held_out_at(sync, "seconds", secs),
    at_most=0.8,
    claim="per second async is ahead too",
)
lesson.expect(
    min(sync.final_accuracy, async_.final_accuracy), at_least=0.9, claim="both end above 90 % accuracy"
)

# %% [markdown]
# Read the three panels against your predictions:
#
# * **per update** the two curves are close: an async update, one fresh-enough batch, does about as much as a sync
#   update averaging three;
# * **per example** async is far ahead: sync reads three batches per update but, at the same learning rate, takes a
#   step of the same length with their average; the better gradient buys little here;
# * **per second** async is ahead too: both read about the same examples per second (the table's examples/s), but
#   async turns every batch into an update, about three updates (one per worker) for each of sync's.
#
# ## Staleness
#
# For every async step tfmagic records how many updates *other* workers applied between this worker reading the
# parameters and applying its gradient. While one worker's gradient is in flight, each of the two others is
# computing one of its own and applies it once per step: so the mean over all gradients is near
# **workers - 1 = 2**, and 2 is the most common staleness. If each step ended at an instant, as the model's
# steps do, the histogram would be a spike at 2.
#
# The real calls that end the steps take a few milliseconds (apply, then read the parameters again), and three
# workers' steps end only P / 3 apart. Two updates that land within those milliseconds land in either order,
# so the spike spreads to 1 and 3, more on a busy machine. And two workers whose steps come to end together
# (contended calls can pull them into step) see each other's update only about half the time: their means fall
# toward 1.5 while the third worker's stays at 2. The cell checks what holds either way, and when over a tenth
# of the updates landed inside another worker's call, the run said so under the table above ("staleness below
# the model's"), with that share.

# %%
stale = async_.staleness()
for task, mean in sorted(stale.items()):
    recs = [r for r in async_.records if r.task == task and not r.warmup]
    fresh = sum(1 for r in recs if r.staleness == 0) / len(recs)
    print(
        f"{task}: mean staleness {mean:.2f}, {fresh:.0%} of its gradients were fresh, max {max(r.staleness for r in recs)}"
    )
recs = [r for r in async_.records if not r.warmup]
counts = Counter(r.staleness for r in recs)
print(
    f"all gradients: mean staleness {sum(r.staleness for r in recs) / len(recs):.2f}; how many were k stale:"
)
print({k: counts[k] for k in sorted(counts)})
lesson.expect(
    sum(r.staleness for r in recs) / len(recs),
    between=(1.6, 2.4),
    claim="the mean over all gradients is near 2",
)
lesson.expect(counts.most_common(1)[0][0] == 2, claim="2 is the most common staleness")
for task, mean in sorted(stale.items()):
    lesson.expect(
        mean, between=(1.3, 2.5), claim=f"{task}'s mean is near 2, or toward 1.5 if it stepped with another"
    )
Image(plots.png_bytes(plots.staleness_figure(async_)))

# %% [markdown]
# ## Exercises
#
# 1. Sync averages three batches: give it three times the learning rate (`lr=0.3`, the "linear scaling rule" of
#    Goyal et al. 2017) and predict where its held-out loss per example lands against async's. Then run
#    `fast = tfmagic.train(cluster, mode="sync", model="digits", steps=300, lr=0.3)` and draw
#    `plots.convergence_figure([fast, async_])`.
# 2. Train with bounded staleness, `%tf_train --mode ssp --staleness 1 --model digits --steps 300`: no worker may
#    run more than one step ahead of the slowest. Where do you expect its updates per second, and its staleness
#    histogram (the live dashboard shows it), between sync and async?
#
# <details><summary>Solutions (click to open)</summary>
#
# 1. Each sync update averages three gradients, so its direction is less noisy (the standard deviation of the
#    average is the single gradient's over √3) and it can take a three times longer step. Per update that wins
#    clearly: one run here, on a cluster paced at 150 ms, ended at a held-out loss of 0.125 with `lr=0.3`, against
#    0.251 for sync at `lr=0.1` and 0.274 for async. Per second it does not change: sync still makes one update
#    per 150 ms step (6.6 updates/s against async's 19.4), so async's 300 updates took 15 s and sync's 45 s.
# 2. Neither in between: on that cluster SSP with bound 1 ran like async (19.31 updates/s against 19.33, mean
#    staleness 1.99 against 1.98, the same spike at 2). Three machines at the same pace never get a step apart,
#    so the bound never makes anyone wait; it only matters when one falls behind (notebook 03's second exercise,
#    and the `ssp` experiment in notebook 06, where a worker stalls).
#
# </details>

# %%
# %tf_cluster stop

# %%
lesson.summary()
