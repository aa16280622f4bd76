"""What a start did: a closed set of outcomes, turned into messages in one place (the session, the magics)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar


@dataclass
class StartOutcome:
    """What a start did.  Exactly one of the subclasses below; ``kind`` names it."""

    kind: ClassVar[str] = "started"
    seconds: float = 0.0
    warm: int = 0
    cold: int = 0
    attempts: int = 1
    notes: list[str] = field(default_factory=list)


@dataclass
class Launched(StartOutcome):
    """Every task was started (``warm`` of them from spare processes)."""

    kind: ClassVar[str] = "launched"


@dataclass
class Reused(StartOutcome):
    """The cluster asked for was already running: nothing was started."""

    kind: ClassVar[str] = "reused"
    age_s: float = 0.0


@dataclass
class Replaced(Launched):
    """Another cluster was running; it was stopped and this one started."""

    kind: ClassVar[str] = "replaced"
    replaced: str = ""


@dataclass
class Restarted(StartOutcome):
    """One task was started again on its old address."""

    kind: ClassVar[str] = "restarted"


@dataclass
class Attached(StartOutcome):
    """A cluster tfmagic did not start answers; nothing was started."""

    kind: ClassVar[str] = "attached"


__all__ = ["Attached", "Launched", "Replaced", "Restarted", "Reused", "StartOutcome"]
