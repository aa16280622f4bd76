"""The parameter-server bottleneck: a step bound by the ps's bandwidth, and a second shard that halves it.

Every worker step reads all parameters from the ps and writes a gradient of
the same size back, so the bytes through a ps's network card per step are
twice the model; with the card's rate fixed, the communication time of a
step is that over the rate, and spreading the variables over two ps shards
(each with its own card) halves it.  d2l's parameter-server chapter does
this arithmetic on paper; here it runs, on a modelled network
(:mod:`tfmagic.network.shaper`: each ps's card at ``RATE``, however fast loopback
is).

The model is built to make the point and nothing else: a linear regression
with four equal blocks of ``BLOCK`` parameters under a small L2 penalty (the
embedding tables that made parameter servers necessary, as the weights that
must travel), whose computation is negligible, so a step's time is its
communication.  Round-robin placement puts two blocks on each of two ps.
The communication time of a step is measured as the async update time with
the shaped card minus the rest of an update (the update time with the card
unlimited; the smaller of the two clusters' figures, since the rest is the
same work in both and a shared machine only ever adds to it).
"""

from __future__ import annotations

import time

import numpy as np

from ..errors import TrainingError
from ..training.models import Data, Model
from .base import Check, Claim, Finding, Lab, figure

CLAIM = Claim(
    "When a step is bound by the parameter server's bandwidth, its communication time is the bytes "
    "through the ps over the ps's rate: doubling the ps shards roughly halves it",
    "Li et al., Scaling Distributed Machine Learning with the Parameter Server, OSDI 2014; "
    "Dive into Deep Learning, section 13.7 (Parameter Servers)",
)

BLOCKS = 4
BLOCK = 250_000  # floats per block: 4 MB in all, read and written once per step
RATE = "50mbit"
DELAY = "1ms"
WORKERS = 2
UPDATES = 10


class Ballast(Model):
    """y = 2x + 10 beside four equal blocks of parameters that only an L2 penalty touches."""

    name = "ballast"

    def __init__(self, seed: int = 0, blocks: int = BLOCKS, block: int = BLOCK):
        rng = np.random.default_rng(seed)
        x = rng.uniform(-1, 1, size=(512 + 128, 1)).astype(np.float32)
        y = (2.0 * x + 10.0 + rng.normal(0, 0.1, size=x.shape)).astype(np.float32)
        super().__init__(Data(x[:512], y[:512], x[512:], y[512:]))
        self.blocks, self.block = blocks, block

    def initial_weights(self, seed: int) -> list[np.ndarray]:
        rng = np.random.default_rng(seed)
        blocks = [rng.normal(0, 0.01, self.block).astype(np.float32) for _ in range(self.blocks)]
        return [np.zeros((1, 1), np.float32), np.zeros((1,), np.float32), *blocks]

    def weight_names(self) -> list[str]:
        return ["w", "b", *(f"table_{i}" for i in range(self.blocks))]

    def predict(self, weights, x, training: bool = False, state=None):
        import tensorflow as tf

        return tf.matmul(x, weights[0]) + weights[1]

    def loss(self, weights, x, y, training: bool = False, state=None):
        import tensorflow as tf

        fit = tf.reduce_mean(tf.square(self.predict(weights, x) - y))
        return fit + 1e-6 * tf.add_n([tf.reduce_sum(tf.square(t)) for t in weights[2:]])


def _update_time(lab: Lab, cluster, label: str) -> float:
    h = lab.train(cluster, "async", UPDATES, label=label, model=Ballast(seed=lab.seed), lr=0.05)
    rate = h.updates_per_s()
    if not rate:
        raise TrainingError(f"the {label} run made no update after its warm-up")
    return 1.0 / rate


def measure(lab: Lab) -> Finding:
    from ..cluster import LocalCluster

    found: dict[int, dict[str, float]] = {}
    for shards in (1, 2):
        lab.progress(f"starting {shards} ps (each card {RATE}, {DELAY}) + {WORKERS} workers")
        cluster = LocalCluster(
            ps=shards, workers=WORKERS, spares=False, net=f"ps:* rate={RATE} delay={DELAY}"
        )
        try:
            cluster.start()
            lab.memory.sample()
            # twice, the faster kept: a shared machine only ever adds to an update's time
            shaped = min(_update_time(lab, cluster, f"{shards} ps, shaped ({i + 1} of 2)") for i in range(2))
            for t in range(shards):
                cluster.net(f"ps:{t}", rate=None, delay=0)
            free = _update_time(lab, cluster, f"{shards} ps, unlimited")
            placement = cluster.placement()
            held = {str(t): share for t, share in placement.shares().items()}
        finally:
            cluster.stop()
        found[shards] = {"shaped": shaped, "free": free}
        lab.progress(
            f"{shards} ps: {shaped * 1e3:.0f} ms per update shaped, {free * 1e3:.0f} ms unlimited; "
            f"shares {', '.join(f'{t} {s:.0%}' for t, s in held.items())}"
        )
        time.sleep(0)  # let the progress line out
    # The rest of an update (computing, calls) is the same work in both; on a shared 2-core
    # machine the least disturbed of its two measurements is the better estimate of it.
    rest = min(found[1]["free"], found[2]["free"])
    for f in found.values():
        f["comm"] = max(f["shaped"] - rest, 1e-9)
    ratio = found[1]["comm"] / found[2]["comm"]
    bytes_per_step = 2 * (BLOCKS * BLOCK + 2) * 4
    model_s = bytes_per_step / 2 / (50e6 / 8)  # one direction's bytes over one direction's rate
    measured = {
        "update time, 1 ps, shaped (s)": found[1]["shaped"],
        "update time, 1 ps, unlimited (s)": found[1]["free"],
        "update time, 2 ps, shaped (s)": found[2]["shaped"],
        "update time, 2 ps, unlimited (s)": found[2]["free"],
        "communication per update, 1 ps (s)": found[1]["comm"],
        "communication per update, 2 ps (s)": found[2]["comm"],
        "the rest of an update (s)": rest,
        "1 ps over 2 ps": ratio,
        "bytes through the ps per step": bytes_per_step,
        "model: one direction's bytes over the rate, 1 ps (s)": model_s,
    }
    checks = [
        Check("communication 1 ps / 2 ps", ratio, 1.6, ">=", "a second shard halves it (about 2)"),
        Check("communication 1 ps / 2 ps", ratio, 2.5, "<=", "about 2, not more"),
        Check(
            "1-ps communication / the bandwidth model",
            found[1]["comm"] / model_s,
            0.7,
            ">=",
            "the ps's card is the bottleneck",
        ),
    ]
    fig, (a, b) = figure()
    xs = [1, 2]
    a.bar([x - 0.2 for x in xs], [found[s]["comm"] * 1e3 for s in xs], 0.4, label="communication")
    a.bar([x + 0.2 for x in xs], [rest * 1e3 for s in xs], 0.4, label="the rest (unlimited card)")
    a.set_xticks(xs)
    a.set_xticklabels(["1 ps", "2 ps"])
    a.set_ylabel("ms per update")
    a.legend(fontsize=8)
    b.plot(xs, [found[s]["comm"] * 1e3 for s in xs], "o-", label="measured")
    b.plot(xs, [found[1]["comm"] * 1e3 / s for s in xs], "k--", label="1 ps / shards")
    b.set_xticks(xs)
    b.set_xlabel("ps shards")
    b.set_ylabel("communication per update (ms)")
    b.legend(fontsize=8)
    fig.tight_layout()
    return Finding(measured, checks, fig, [f"each ps's card: {RATE} each way, {DELAY} one way"])
