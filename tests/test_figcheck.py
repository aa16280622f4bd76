"""The figure check finds what a student would stumble on, and passes a figure that reads.

Each case is a real matplotlib figure drawn on Agg, with one of the faults the lessons' figures had
(a title cut at the edge, "nobody slowednobody slowed", an unlabelled axis, ``2x10^0`` ticks).
tfmagic's own figures are checked on real runs in tests/test_dashboard.py.
"""

from __future__ import annotations

import pytest
from matplotlib.figure import Figure

from tfmagic import figcheck, plots
from tfmagic.errors import LessonCheckFailed

pytestmark = pytest.mark.unit


def readable() -> Figure:
    fig = Figure(figsize=(5, 3), dpi=100)
    ax = fig.subplots()
    ax.plot([1, 2, 3], [3, 1, 2])
    ax.set_title("loss")
    ax.set_xlabel("updates")
    ax.set_ylabel("loss")
    fig.tight_layout()
    return fig


def test_a_figure_that_reads_has_no_problem():
    assert figcheck.problems(readable()) == []


def test_a_title_longer_than_the_figure_is_cut():
    fig = readable()
    fig.axes[0].set_title("held-out loss against seconds after warm-up, every mode, every worker")
    (found,) = figcheck.problems(fig)
    assert "is cut at the figure's" in found and "held-out loss" in found


def test_tick_labels_written_over_each_other():
    fig = Figure(figsize=(3, 2), dpi=100)
    ax = fig.subplots()
    ax.bar(range(6), [1, 2, 3, 2, 1, 2])
    ax.set_xticks(range(6), ["nobody slowed"] * 6)
    ax.set_xlabel("who was slowed")
    ax.set_ylabel("seconds per update")
    found = figcheck.problems(fig)
    assert any("'nobody slowed' and 'nobody slowed' are drawn over each other" in f for f in found), found


def test_an_axis_with_numbers_needs_a_label():
    fig = readable()
    fig.axes[0].set_ylabel("")
    assert figcheck.problems(fig) == ["the y axis of 'loss' has numbers but no label"]


def test_an_axis_of_named_categories_names_itself():
    fig = Figure(figsize=(5, 3), dpi=100)
    ax = fig.subplots()
    ax.bar(["worker:0", "worker:1", "worker:2"], [2.5, 2.5, 0.6])
    ax.set_ylabel("async steps/s")
    assert figcheck.problems(fig) == []


def test_log_ticks_read_as_plain_numbers_with_log_y():
    fig = readable()
    ax = fig.axes[0]
    ax.set_yscale("log")
    ax.set_ylim(1.2, 3.5)  # less than a decade: matplotlib labels the minor ticks 2x10^0, 3x10^0
    assert any("power of ten to the 0" in f for f in figcheck.problems(fig))
    plots.log_y(ax, "loss (log scale)")
    ax.set_ylim(1.2, 3.5)
    assert figcheck.problems(fig) == []


def test_animated_text_is_checked_and_stays_animated():
    fig = readable()
    ax = fig.axes[0]
    note = ax.text(
        0.9, 0.5, "worker:1 killed at update 40, restarted at 90", transform=ax.transAxes, animated=True
    )
    (found,) = figcheck.problems(fig)
    assert "worker:1 killed" in found and "right edge" in found
    assert note.get_animated()


def test_require_names_the_figure_and_checked_only_when_strict(monkeypatch):
    fig = readable()
    fig.axes[0].set_xlabel("")
    with pytest.raises(LessonCheckFailed, match=r"^the demo's picture: the x axis of 'loss' has numbers"):
        figcheck.require(fig, "the demo's picture")
    monkeypatch.delenv("TFMAGIC_LESSON_STRICT", raising=False)
    assert figcheck.checked(fig, "the demo's picture") is fig
    monkeypatch.setenv("TFMAGIC_LESSON_STRICT", "1")
    with pytest.raises(LessonCheckFailed):
        figcheck.checked(fig, "the demo's picture")
