"""The status table as data and as HTML (no processes)."""

from __future__ import annotations

import re

import pytest

from tfmagic.status import ClusterStatus, TaskStatus

pytestmark = pytest.mark.unit


def test_the_html_table_colours_each_tasks_state_and_nothing_else():
    status = ClusterStatus(
        "c1",
        "1 ps, 2 workers",
        [
            TaskStatus("ps:0", "127.0.0.1:1", 101, "running"),
            TaskStatus("worker:0", "127.0.0.1:2", 102, "failed"),
            TaskStatus("worker:1", "127.0.0.1:3", None, "stopped"),
        ],
    )
    page = status._repr_html_()
    coloured = re.findall(r"<td style='color:(#[0-9a-f]+);font-weight:600'>([^<]*)</td>", page)
    assert coloured == [("#1a7f37", "running"), ("#cf222e", "failed"), ("#6e7781", "stopped")], page
    assert "<td>101</td>" in page and "<td>-</td>" in page  # the pid column is plain
    assert status["worker:0"].state == "failed" and len(status) == 3
    assert "worker:1" in str(status) and "stopped" in str(status)
