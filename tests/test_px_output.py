"""A %%tf_px cell's output, however many pieces it comes in, is kept whole and in order.

It is collected as a list of pieces joined when read (``outcome.stdout += text`` copied the whole
output at every piece: a 50 MB print delivered 8 MB in 300 s)."""

from __future__ import annotations

import pytest

from tfmagic.px import TaskOutcome

pytestmark = pytest.mark.unit


def test_many_small_pieces_cost_linear_time_and_keep_their_order():
    outcome = TaskOutcome("worker:0")
    for i in range(200_000):
        outcome.add("stdout", f"{i}\n")
        if i % 50_000 == 0:
            assert outcome.stdout.endswith(f"{i}\n")  # reading while it streams
    outcome.add("stderr", "warning\n")
    lines = outcome.stdout.splitlines()
    assert lines[:3] == ["0", "1", "2"] and lines[-1] == "199999" and len(lines) == 200_000
    assert outcome.stderr == "warning\n"
