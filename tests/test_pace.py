"""The modelled machines' stalls on purpose (tfmagic.pace)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.unit


def test_a_stall_on_purpose_lengthens_that_step_of_that_task_in_every_run():
    """pace stalls: (task, step, factor) the same in every run, on top of the seeded jitter."""
    from tfmagic.errors import BadPace
    from tfmagic.pace import Pace

    plain = Pace.parse(0.1, jitter=0.4, seed=3)
    stalled = Pace.parse(0.1, jitter=0.4, seed=3, stalls=(("worker:3", 15, 12.0),))
    for step in range(30):
        for task in ("worker:0", "worker:3"):
            a, b = plain.duration(task, step), stalled.duration(task, step)
            assert b == pytest.approx(a * (12.0 if (task, step) == ("worker:3", 15) else 1.0))
    assert "worker:3's step 15 x12" in stalled.describe()
    with pytest.raises(BadPace, match="a stall is"):
        Pace.parse(0.1, stalls=(("worker:0", 3, 0.5),))
