"""Checkpoints: the ps's weights, slots and global step, saved every few updates to this machine.

A lost ps takes its variables with it; ``run.resume()`` starts again from
the last checkpoint once the ps is restarted.  A checkpoint is one ``.npz``
written beside and then moved over the last one, so a crash mid-write never
leaves a broken file.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from .params import ParameterStore, clear_executor


class Checkpoints:
    """Saving and loading one run's checkpoint."""

    def __init__(self, directory: Path, name: str, every: int) -> None:
        self.directory = Path(directory)
        self.name = name
        self.every = every
        self.last_step = -1
        #: why checkpoint attempts failed, each reason once
        self.errors: list[str] = []

    @property
    def path(self) -> Path:
        return self.directory / f"{self.name}.npz"

    def last(self) -> Path | None:
        return self.path if self.path.exists() else None

    def maybe_save(
        self, params: ParameterStore, step: int, since: int, limit: int, force: bool = False
    ) -> None:
        """Save when ``every`` updates passed since the last one (or ``since``), or when forced."""
        if not force and step - max(self.last_step, since) < self.every:
            return
        try:
            weights, slots, step = params.snapshot(limit)
        except Exception as exc:  # noqa: BLE001 - a lost ps; reported by the step that sees it
            clear_executor()
            lines = str(exc).splitlines() or [""]
            where = [ln for ln in lines if "from remote target" in ln]  # which task answered so
            why = f"{type(exc).__name__}: {lines[0]}" + (f" [{where[0].strip()}]" if where else "")
            if why not in self.errors:
                self.errors.append(why)
            return False
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = self.directory / f".{self.name}.tmp.npz"
        arrays = {f"w{i}": w for i, w in enumerate(weights)} | {f"s{i}": s for i, s in enumerate(slots)}
        np.savez(tmp, step=step, n_weights=len(weights), n_slots=len(slots), **arrays)
        os.replace(tmp, self.path)
        self.last_step = step
        return True

    def load(self) -> tuple[list[np.ndarray], list[np.ndarray], int]:
        """(weights, slots, step) of the last checkpoint."""
        data = np.load(self.path)
        weights = [data[f"w{i}"] for i in range(int(data["n_weights"]))]
        slots = [data[f"s{i}"] for i in range(int(data["n_slots"]))]
        return weights, slots, int(data["step"])
