"""Keras stays out of ``import tensorflow`` once tfmagic is imported, and still works when asked for."""

from __future__ import annotations

import os
import subprocess
import sys
import types

import pytest

from tfmagic import kerasgate

PROGRAM = """
import sys
import tfmagic
import tensorflow as tf
loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('keras', 'matplotlib'))
print('after import tensorflow:', len(loaded))
layer = tf.keras.layers.Dense(2)
print('tf.keras gives', type(layer).__module__)
"""


def run(eager: bool) -> str:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    env.pop("TFMAGIC_EAGER_KERAS", None)
    if eager:
        env["TFMAGIC_EAGER_KERAS"] = "1"
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.mark.cluster
def test_import_tensorflow_after_tfmagic_loads_no_keras_and_tf_keras_still_works():
    gated = run(eager=False)
    assert "after import tensorflow: 0\n" in gated
    assert "tf.keras gives keras.src.layers" in gated
    # the gate is what keeps it out: without it TensorFlow's own import loads Keras (and matplotlib)
    eager = run(eager=True)
    assert "after import tensorflow: 0\n" not in eager
    assert "tf.keras gives keras.src.layers" in eager


@pytest.mark.unit
def test_the_gate_declines_keras_src_only_while_tensorflow_initialises(monkeypatch):
    gate = kerasgate.KerasGate()
    fake = types.ModuleType("tensorflow")
    fake.__spec__ = types.SimpleNamespace(_initializing=True)
    monkeypatch.setitem(sys.modules, "tensorflow", fake)
    with pytest.raises(ImportError, match="imported when first used"):
        gate.find_spec("keras.src")
    assert gate.find_spec("keras") is None  # TensorFlow's find_spec("keras") must not fail
    assert gate.find_spec("keras.src.optimizers") is None  # never reached: its parent failed
    fake.__spec__._initializing = False
    assert gate.find_spec("keras.src") is None
    assert sum(isinstance(f, kerasgate.KerasGate) for f in sys.meta_path) == 1  # import tfmagic installed one
