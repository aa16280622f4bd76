"""The name this module had before the cluster package: see :mod:`tfmagic.cluster.membership`."""

from __future__ import annotations

from .cluster.membership import *  # noqa: F403 - an alias of the module's public names
from .cluster.membership import RELEASE_TIMEOUT, __all__  # noqa: F401
