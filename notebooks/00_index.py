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
# # Distributed TensorFlow, from one notebook: the course
#
# Nine notebooks, each a lesson of 15 to 30 minutes. Each starts a real cluster on this machine
# (TensorFlow servers in their own processes, talking gRPC), opens with what you will learn, asks you
# to **predict** before the cells that show an effect, and ends with exercises (01, 04, 05 and 08 with their
# solutions, collapsed). The five articles this course grew from (the "source articles") are cited where
# they are checked.
#
# **Every lesson checks what it says.** Where the text makes a statement about what a cell shows ("a x4
# straggler makes sync about 4 times slower"), the cell checks it on the run you just made and prints one
# line: `✓` with what was measured, or `✗ did not hold in this run` with what was measured instead (a busy
# machine can do that; run the cell again). The last cell counts them. The committed outputs come from runs
# in which every check held.
#
# *minutes*: a student's time with the lesson; *runs in*: its cells top to bottom on a 2-core machine
# (05 with SSH hosts and Spark).
#
# | notebook | you will learn | minutes | runs in | needs |
# | --- | --- | --- | --- | --- |
# | [01 · Cluster basics](01_cluster_basics.ipynb) | jobs, tasks, servers and the client; variables on the ps, ops on the workers; proving that workers cooperated; TF1 sessions | 15 | 25 s | start here |
# | [02 · Sync vs async](02_sync_vs_async.ipynb) | what each mode does to the workers' time, updates per second, loss per update, staleness | 20 | 1.1 min | 01 |
# | [03 · Stragglers and failures](03_stragglers_and_failures.ipynb) | one slow worker paces sync; backup workers; what a dead worker does to each mode | 25 | 2.6 min | 02 |
# | [04 · Between-graph](04_between_graph.ipynb) | the source articles' TF1 programs in every task; TF2's `ParameterServerStrategy` and all-reduce | 20 | 1.4 min | 01 |
# | [05 · Beyond one machine](05_beyond_one_machine.ipynb) | the same cluster over SSH and Spark; attaching to a cluster someone else started | 20 | 39 s | 01; SSH hosts or Spark for parts |
# | [06 · The classic experiments](06_classic_experiments.ipynb) | six textbook claims, measured and checked against what was published | 30 | 2.7 min | 02, 03 |
# | [07 · Inside the cluster](07_inside_the_cluster.ipynb) | where every variable lives, what moves over each link, who waits on whom when it hangs | 20 | 1.6 min | 01 |
# | [08 · What else the source articles ask](08_from_the_seeds.ipynb) | a ps on the CPU and a GPU per worker; model parallelism; resizing a running cluster; TensorFlowOnSpark's `map_fun(args, ctx)` in tfmagic; TensorBoard's weight histograms; each worker its own batch size | 20 | 1.1 min | 01, 04 |
# | [09 · A datacenter on your laptop](09_a_datacenter_on_your_laptop.ipynb) | 2 ps and 32 workers in 2 GB: servers sharing processes; staleness at 32 and 8 workers; a machine's death among many; where a laptop stops modelling a datacenter | 15 | 2.3 min | 02 |
#
# ```text
#   this notebook's kernel ── the client: builds the ops, says where each runs, draws the plots
#          │  gRPC (and tfmagic's own authenticated channel to each task process)
#    ┌─────┴──────┬────────────┬────────────┐
#   ps:0        worker:0     worker:1     worker:2 ...   one process each, started by %tf_cluster start
#   variables   gradients    gradients    gradients
# ```
#
# **On Binder** (the badge in the README), every notebook runs top to bottom; the parts that need
# SSH hosts or Spark (in 05) say so in one line and are skipped. Binder gives 1 GB of memory for sure
# and up to 2 GB: the cell below tells you what this machine has, and docs/server.md lists each
# notebook's measured peak.

# %%
# %load_ext tfmagic
import os

import tensorflow as tf

import tfmagic
from tfmagic.procs import memory

print(f"tfmagic {tfmagic.__version__}, TensorFlow {tf.__version__}, {os.cpu_count()} CPU cores")
limit = memory.lowest_limit()
print(
    f"memory: {memory.memory_available() / 2**30:.1f} GB available now, "
    f"at most {limit.bytes / 2**30:.1f} GB ({limit.source})"
)
print("a cluster of 1 ps + 2 workers and this kernel take about 1.0 GB (PSS; docs/operations.md)")

# %% [markdown]
# ## How to use these notebooks
#
# * Run the cells in order (Shift-Enter). A cluster runs until `%tf_cluster stop`, `%unload_ext tfmagic`
#   or the kernel's end: nothing is left behind, even if the kernel is killed.
# * Each notebook is committed with the outputs of a real run on a two-core machine, so you can read it
#   before running it; your numbers will differ a little, and the text says which numbers must not.
# * `%tf_cluster?` lists every command; `%tf_cluster why` explains a cell that hangs.
