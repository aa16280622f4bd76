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
# Seed 001 states the trade-off this notebook measures on a real cluster:
#
# * **synchronous SGD**: every step, each worker computes a gradient from the *same* parameters; the gradients
#   are averaged and applied once. The loss falls smoothly, but each step waits for the slowest worker.
# * **asynchronous SGD** (Downpour): each worker applies its gradient as soon as it has one. Nobody waits, but a
#   worker's gradient may have been computed from parameters that others have already changed: it is **stale**.
#
# Both runs below start from the same initial weights, train the same model (a small MLP on scikit-learn's
# handwritten digits) on the same data shards, with one ps and two workers, and apply the same number of updates.

# %%
# %load_ext tfmagic
# %tf_cluster start --ps 1 --workers 2

# %%
from IPython.display import Image

import tfmagic
from tfmagic import plots

cluster = tfmagic.current_cluster()
comp = tfmagic.compare(cluster, model="digits", steps=400, lr=0.1, batch_size=32)
sync, async_ = comp.histories
print(comp.table())

# %% [markdown]
# ## Convergence per update and per second
#
# Per **update** the two curves are close: an async update is almost as good as a sync one here (two workers make
# gradients only slightly stale). Per **second** async is ahead: it applies an update whenever any worker is done,
# while sync pays for a full round (both workers, then the apply) per update.

# %%
Image(plots.png_bytes(plots.convergence_figure(comp.histories)))

# %%
print(
    f"updates per second: sync {sync.updates_per_s():.1f}, async {async_.updates_per_s():.1f} "
    f"-> async applies {async_.updates_per_s() / sync.updates_per_s():.2f}x as many updates per second"
)
print(f"held-out loss after {sync.steps} updates: sync {sync.final_loss:.4f}, async {async_.final_loss:.4f}")
print(f"accuracy: sync {sync.final_accuracy:.3f}, async {async_.final_accuracy:.3f}")

# %% [markdown]
# ## Throughput per worker
#
# In sync mode both workers do every step, so their throughput is identical: the slower one sets it
# (each worker step counts, so sync's total worker steps are twice its updates). In async mode each worker
# runs at its own pace, and every worker step is an update.

# %%
for h in comp.histories:
    print(h.summary())
    print()

# %% [markdown]
# ## Staleness
#
# For every async step tfmagic records how many updates *other* workers applied between this worker reading
# the parameters and applying its gradient. Zero means the gradient was fresh.

# %%
stale = async_.staleness()
for task, mean in sorted(stale.items()):
    recs = [r for r in async_.records if r.task == task]
    fresh = sum(1 for r in recs if r.staleness == 0) / len(recs)
    print(
        f"{task}: mean staleness {mean:.2f}, {fresh:.0%} of its gradients were fresh, max {max(r.staleness for r in recs)}"
    )
Image(plots.png_bytes(plots.staleness_figure(async_)))

# %% [markdown]
# With more workers, or a slow one (notebook 03), gradients get staler and async's loss gets noisier.
# Adagrad (`optimizer="adagrad"`) is what Dean et al. used to steady Downpour SGD.

# %%
# %tf_cluster stop
