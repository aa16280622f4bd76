"""Keep Keras out of ``import tensorflow``: tfmagic never uses it there, and it costs every kernel.

TensorFlow's ``__init__`` ends by importing ``keras.src.optimizers`` eagerly, only so that Keras's
optimizers are in SavedModel's registry before anyone loads a model (b/196254385). That import pulls
in all of Keras and, through it, matplotlib.pyplot: about 1.6 of the 6.3 CPU seconds
``import tensorflow`` costs here and 70 MB of memory (``python bench/import_cost.py``), in every
kernel, notebook kernel and test process that imports TensorFlow, on a machine where a class's
kernels share two cores and Binder gives 2 GB. tfmagic's engine does not use Keras (Keras 3 has no
parameter-server training), so ``import tfmagic`` installs :class:`KerasGate`, which declines
``keras.src`` while TensorFlow itself is being imported, and nothing else, ever.

Keras still works as before when it is asked for: ``tf.keras``, ``import keras`` and
:class:`tfmagic.training.KerasModel` import it at first use, and that import registers its
optimizers then. The one thing deferred is a SavedModel that names a Keras optimizer, loaded before
Keras was imported; ``TFMAGIC_EAGER_KERAS=1`` (set before ``import tfmagic``) turns the gate off.
"""

from __future__ import annotations

import importlib.abc
import os
import sys

#: the eager imports TensorFlow's ``__init__`` makes (Keras 3, or tf_keras with TF_USE_LEGACY_KERAS)
HELD_BACK = ("keras.src", "tf_keras.src")


class KerasGate(importlib.abc.MetaPathFinder):
    """Declines :data:`HELD_BACK` while the ``tensorflow`` package is still initialising.

    Declining ``keras.src`` rather than ``keras`` matters: TensorFlow asks
    ``importlib.util.find_spec("keras")`` during its import and treats a finder's error there as
    fatal, while its eager import of ``keras.src.optimizers`` sits in a ``try`` that passes on
    ``ImportError``. A failed package import leaves nothing of Keras in ``sys.modules``, so a later
    ``import keras`` starts clean.
    """

    def find_spec(self, name, path=None, target=None):
        if name in HELD_BACK and tensorflow_initialising():
            raise ImportError(f"{name} is imported when first used (tfmagic.kerasgate)")
        return None


def tensorflow_initialising() -> bool:
    """Whether ``import tensorflow`` is running now (its module exists but has not finished)."""
    tf = sys.modules.get("tensorflow")
    return bool(getattr(getattr(tf, "__spec__", None), "_initializing", False))


def install() -> None:
    """Put the gate first on ``sys.meta_path``, once; nothing if ``TFMAGIC_EAGER_KERAS=1``."""
    if os.environ.get("TFMAGIC_EAGER_KERAS") == "1":
        return
    if not any(isinstance(finder, KerasGate) for finder in sys.meta_path):
        sys.meta_path.insert(0, KerasGate())
