"""tfmagic.lesson: a lesson's statements checked against its own run."""

from __future__ import annotations

import pytest

from tfmagic import lesson

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.delenv(lesson.STRICT_ENV, raising=False)
    lesson.reset()
    yield
    lesson.reset()


def test_a_statement_that_holds_prints_one_line_with_what_was_measured(capsys):
    check = lesson.expect(3.87, between=(3, 5), claim="a x4 straggler makes sync about 4x slower")
    assert check.held
    assert capsys.readouterr().out == (
        "✓ a x4 straggler makes sync about 4x slower (measured 3.87; expected 3 to 5)\n"
    )


def test_a_contradicted_statement_says_so_and_strict_mode_raises(capsys, monkeypatch):
    check = lesson.expect(150, at_most=1.5, claim="both workers shared the steps")
    assert not check.held
    out = capsys.readouterr().out
    assert out.startswith(
        "✗ did not hold in this run: both workers shared the steps (measured 150; expected at most 1.5)"
    )
    monkeypatch.setenv(lesson.STRICT_ENV, "1")
    with pytest.raises(lesson.LessonCheckFailed, match="did not hold in this run"):
        lesson.expect(0.5, near=1.0, claim="the pace was kept")


@pytest.mark.parametrize(
    ("kwargs", "held"),
    [
        ({"at_least": 2}, True),
        ({"at_least": 2.1}, False),
        ({"at_most": 2}, True),
        ({"near": 2.15, "within": 0.1}, True),
        ({"near": 2.5, "within": 0.1}, False),
        ({"between": (0, 1)}, False),
    ],
)
def test_each_judge(kwargs, held):
    assert lesson.expect(2.0, claim="x", **kwargs).held is held


def test_a_comparison_is_judged_by_its_truth_and_nan_never_holds():
    assert lesson.expect(3 < 4, claim="three is less than four").held
    assert not lesson.expect([], claim="an empty list is nothing").held
    assert not lesson.expect(float("nan"), at_least=0, claim="nan").held


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"between": (5, 3)}, "is empty"),
        ({"between": (1,)}, "two numbers"),
        ({"at_least": 1, "at_most": 2}, "give one of"),
        ({"near": float("inf")}, "infinite"),
        ({"near": 1, "within": -0.1}, "negative"),
        ({}, "is a number"),
        ({"at_least": "many"}, "must be a number"),
    ],
)
def test_an_impossible_expectation_is_one_line_about_the_lesson(kwargs, message):
    with pytest.raises(lesson.BadExpectation, match=message) as err:
        lesson.expect(2.0, claim="x", **kwargs)
    assert "\n" not in str(err.value)
    assert lesson.checks() == []


def test_a_claim_is_required():
    with pytest.raises(lesson.BadExpectation, match="claim="):
        lesson.expect(1, at_least=0, claim=" ")


def test_the_summary_counts_and_names_what_did_not_hold(capsys):
    assert lesson.summary() == "This lesson checked no statement in this run."
    lesson.expect(1, at_least=0, claim="one")
    assert lesson.summary().startswith("✓ All 1 statements")
    lesson.expect(1, at_least=2, claim="two")
    text = lesson.summary()
    assert text.startswith("✗ 1 of 2 statements did not hold in this run: two.")


def test_say_prints_outside_ipython(capsys, monkeypatch):
    import IPython

    monkeypatch.setattr(IPython, "get_ipython", lambda: None)  # another test may have made a shell here
    assert lesson.say("sync took **1.2 s**") == "sync took **1.2 s**"
    assert capsys.readouterr().out == "sync took **1.2 s**\n"
