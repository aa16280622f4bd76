"""The test lanes' hold (tests/conftest.py): a rerun of a timed check waits for the other lanes' tests
to end and holds their next ones back until its own test ends."""

from __future__ import annotations

import os
import threading
import time

import pytest

from . import conftest

pytestmark = pytest.mark.unit


def test_a_rerun_holds_the_other_lane_at_its_next_test_until_its_own_test_ends(tmp_path, monkeypatch):
    monkeypatch.setattr(conftest, "LANES_DIR", str(tmp_path))
    monkeypatch.setattr(conftest, "QUIET_WAIT_S", 10.0)
    monkeypatch.setattr(conftest, "_MY_LANE", "timed")
    (tmp_path / "rest").write_text("tests/test_x.py::test_long@rest")
    released = []

    def rest_lane():
        time.sleep(0.5)  # its test ends; its next one's setup:
        conftest._wait_while_held("rest")
        released.append(time.monotonic())

    t0 = time.monotonic()
    lane = threading.Thread(target=rest_lane)
    lane.start()
    conftest.hold_other_lanes("experiment x")
    held_at = time.monotonic()
    assert 0.4 < held_at - t0 < 5, "the rerun waited for the other lane's test to end, and no longer"
    assert (tmp_path / "rest").read_text() == "held while the timed lane reruns experiment x"
    assert "quiet" not in conftest.beside()  # the hold is not a lane
    time.sleep(0.5)
    assert not released, "held while the rerun runs"
    conftest.pytest_runtest_teardown(None)  # the rerun's test ends
    lane.join(5)
    assert released and not (tmp_path / conftest.QUIET).exists()


def test_a_lane_that_ran_its_last_test_or_a_dead_holder_holds_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(conftest, "LANES_DIR", str(tmp_path))
    monkeypatch.setattr(conftest, "_MY_LANE", "timed")
    (tmp_path / "rest").write_text(conftest.DONE)
    t0 = time.monotonic()
    conftest.hold_other_lanes("experiment y")
    assert time.monotonic() - t0 < 1, "a finished lane is not waited for"
    (tmp_path / conftest.QUIET).write_text("999999999 experiment z")  # no such process
    t0 = time.monotonic()
    conftest._wait_while_held("rest")
    assert time.monotonic() - t0 < 1
    os.remove(tmp_path / conftest.QUIET)
