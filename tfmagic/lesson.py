"""Lessons that hold to their own outputs: every statement about a run, checked by that run.

A lesson's prose says what its cells show ("a x4 straggler makes sync about
4x slower").  Machines differ and runs vary, so a sentence written once can
be contradicted by the output right under it, and a student then learns
from whichever they believe.  Each such statement goes through
:func:`expect`, in the cell that measures it::

    from tfmagic import lesson
    lesson.expect(ratio, between=(3, 5), claim="a x4 straggler makes sync about 4x slower")
    # ✓ a x4 straggler makes sync about 4x slower (measured 3.87; expected 3 to 5)

A statement the run contradicts prints ``✗ did not hold in this run: ...``
with what was measured, and the notebook says so again at its end
(:func:`summary`).  With ``TFMAGIC_LESSON_STRICT=1`` (the notebook tests
set it) it raises :class:`LessonCheckFailed` at once, so a committed
notebook comes from a run in which every check held.

Numbers the prose quotes come from the run through :func:`say` (Markdown
rendered from the run's values), so nothing is typed twice.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from .errors import BadExpectation, LessonCheckFailed

__all__ = [
    "Check",
    "LessonCheckFailed",
    "BadExpectation",
    "expect",
    "checks",
    "summary",
    "say",
    "reset",
    "strict",
]

#: set to 1 to make a statement that does not hold raise (the notebook tests do)
STRICT_ENV = "TFMAGIC_LESSON_STRICT"

HELD, FAILED = "✓", "✗"


@dataclass(frozen=True)
class Check:
    """One statement and what the run measured for it."""

    claim: str
    held: bool
    expected: str
    measured: object

    def _ipython_display_(self) -> None:
        """Shown once, by :func:`expect`: a cell ending in ``lesson.expect(...)`` shows nothing more."""

    @property
    def line(self) -> str:
        """The one line a student reads under the cell."""
        shown = _fmt(self.measured)
        if self.held:
            return f"{HELD} {self.claim} (measured {shown}; {self.expected})"
        return (
            f"{FAILED} did not hold in this run: {self.claim} (measured {shown}; {self.expected}). "
            "What you see above differs from what the lesson says: if the machine was busy, run the cell again."
        )


class Summary(str):
    """The text of :func:`summary`, which it has printed: a cell ending in it shows nothing more."""

    def _ipython_display_(self) -> None:
        pass


_checks: list[Check] = []


def expect(
    value,
    *,
    claim: str,
    between: tuple[float, float] | None = None,
    at_least: float | None = None,
    at_most: float | None = None,
    near: float | None = None,
    within: float = 0.1,
) -> Check:
    """Check one statement of the lesson against this run, and show the result in one line.

    ``value`` is what the run measured; the statement is ``claim``.  A number
    is judged by exactly one of ``between=(lo, hi)``, ``at_least=``,
    ``at_most=`` or ``near=x`` (within the fraction ``within`` of x, 10 % by
    default).  Anything else (a comparison, ``a < b``) is judged by its truth.
    Returns the :class:`Check`; raises :class:`LessonCheckFailed` when it did
    not hold and ``TFMAGIC_LESSON_STRICT`` is set.
    """
    if not isinstance(claim, str) or not claim.strip():
        raise BadExpectation("lesson.expect needs claim=: the sentence of the lesson this checks")
    judges = [j for j in (between, at_least, at_most, near) if j is not None]
    if len(judges) > 1:
        raise BadExpectation(
            "give one of between=, at_least=, at_most= or near= (combine bounds with between=(lo, hi))"
        )
    if not judges:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            raise BadExpectation(
                f"{value!r} is a number: give between=, at_least=, at_most= or near= to judge it, "
                "or pass a comparison"
            )
        held = bool(value)
        return _record(Check(claim.strip(), held, "expected: yes", "yes" if held else "no"))
    measured = _number(value, "the measured value")
    if between is not None:
        try:
            lo, hi = (_number(b, "between's bounds") for b in between)
        except (TypeError, ValueError):
            raise BadExpectation(f"between={between!r} must be two numbers, (low, high)") from None
        if lo > hi:
            raise BadExpectation(
                f"between=({lo:g}, {hi:g}) is empty: no value is at least {lo:g} and at most {hi:g}; "
                "give (low, high)"
            )
        held, expected = lo <= measured <= hi, f"expected {_fmt(lo)} to {_fmt(hi)}"
    elif at_least is not None:
        bound = _number(at_least, "at_least")
        held, expected = measured >= bound, f"expected at least {_fmt(bound)}"
    elif at_most is not None:
        bound = _number(at_most, "at_most")
        held, expected = measured <= bound, f"expected at most {_fmt(bound)}"
    else:
        target, frac = _number(near, "near"), _number(within, "within")
        if frac < 0:
            raise BadExpectation(f"within={within!r} is negative: give a fraction such as 0.1 (10 %)")
        held = abs(measured - target) <= frac * abs(target)
        expected = f"expected {_fmt(target)} within {frac * 100:g} %"
    if math.isnan(measured):
        held = False
    return _record(Check(claim.strip(), held, expected, measured))


def _number(value, what: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise BadExpectation(f"{what} must be a number, not {value!r}") from None
    if math.isinf(number):
        raise BadExpectation(f"{what} is infinite: nothing can be checked against it")
    return number


def _fmt(value) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int) or float(value).is_integer() and abs(value) < 1e6:
        return f"{int(value)}"
    return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"


def strict() -> bool:
    """Whether a statement that does not hold raises (``TFMAGIC_LESSON_STRICT`` set, as the notebook tests do)."""
    return os.environ.get(STRICT_ENV, "") not in ("", "0")


def _record(check: Check) -> Check:
    _checks.append(check)
    print(check.line, flush=True)
    if not check.held and strict():
        raise LessonCheckFailed(check.line)
    return check


def checks() -> list[Check]:
    """Every statement checked in this process so far, in order."""
    return list(_checks)


def reset() -> None:
    """Forget the checks so far (a lesson re-run from its top)."""
    _checks.clear()


def summary() -> str:
    """The lesson's last line: how many of its statements held in this run, naming any that did not."""
    failed = [c for c in _checks if not c.held]
    if not _checks:
        text = "This lesson checked no statement in this run."
    elif not failed:
        text = f"{HELD} All {len(_checks)} statements this lesson makes about its outputs held in this run."
    else:
        names = "; ".join(c.claim for c in failed)
        text = (
            f"{FAILED} {len(failed)} of {len(_checks)} statements did not hold in this run: {names}. "
            "Their cells say what was measured instead."
        )
    print(text, flush=True)
    return Summary(text)


def say(markdown: str):
    """Show prose made from the run's own numbers (``lesson.say(f"sync took {t:.1f} s")``).

    In a notebook it renders as Markdown; elsewhere it prints.  Returns what was shown.
    """
    try:
        from IPython import get_ipython
        from IPython.display import Markdown, display
    except ImportError:  # a script without IPython
        print(markdown, flush=True)
        return markdown
    if get_ipython() is None:
        print(markdown, flush=True)
    else:
        display(Markdown(markdown))
    return markdown
