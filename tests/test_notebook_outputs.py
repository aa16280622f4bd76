"""The committed notebooks, read as a student reads them: what they print agrees with what they say.

Each lesson checks its statements about its own outputs when it runs (``tfmagic.lesson``), and the
notebook tests run them strictly.  These tests read the committed outputs (no kernel, no cluster):
they must come from a run in which every check held, and carry nothing a student should not have
to read past (TensorFlow's start-up noise, a missed pace, paths of the machine that ran them).
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

pytestmark = pytest.mark.unit
NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
LESSONS = sorted(p.name for p in NOTEBOOKS.glob("0[1-9]_*.ipynb"))

#: lessons whose statements about their outputs go through tfmagic.lesson: every lesson
SELF_CHECKED = {
    "01_cluster_basics.ipynb",
    "02_sync_vs_async.ipynb",
    "03_stragglers_and_failures.ipynb",
    "04_between_graph.ipynb",
    "05_beyond_one_machine.ipynb",
    "06_classic_experiments.ipynb",
    "07_inside_the_cluster.ipynb",
    "08_from_the_seeds.ipynb",
    "09_a_datacenter_on_your_laptop.ipynb",
}

#: what TensorFlow prints while it starts, which a student should not have to read past
STARTUP_NOISE = (
    "absl::InitializeLog",
    "Could not find cuda drivers",
    "cuInit",
    "oneDNN custom operations",
    "This TensorFlow binary is optimized",
)
#: paths of the machine that ran the notebook: a student cannot open them
BUILD_PATHS = re.compile(r"/work/|/root/|/tmp/pytest|/check/")


def _outputs(nb) -> str:
    text = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                text.append(out["text"])
            elif "data" in out:
                text.append(str(out["data"].get("text/plain", "")))
                text.append(str(out["data"].get("text/markdown", "")))
            elif out.get("output_type") == "error":
                text.append("\n".join(out.get("traceback", [])))
    return "\n".join(text)


@pytest.fixture(scope="module", params=LESSONS)
def lesson_nb(request):
    nb = nbformat.read(NOTEBOOKS / request.param, as_version=4)
    return request.param, nb, _outputs(nb)


def test_every_lesson_was_committed_with_the_outputs_of_a_full_run(lesson_nb):
    name, nb, text = lesson_nb
    code = [c for c in nb.cells if c.cell_type == "code" and c.source.strip()]
    missing = [c.source.splitlines()[0] for c in code if c.get("execution_count") is None]
    assert not missing, f"{name}: cells not run before the commit: {missing[:3]}"
    assert "Traceback" not in text, f"{name} was committed with an error in its outputs"


def test_no_statement_contradicted_by_the_committed_output(lesson_nb):
    name, _nb, text = lesson_nb
    failed = [line for line in text.splitlines() if line.startswith("✗")]
    assert not failed, f"{name} says one thing and shows another: {failed}"


@pytest.mark.parametrize("name", sorted(SELF_CHECKED))
def test_self_checked_lessons_end_with_every_check_held(name):
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    text = _outputs(nb)
    held = [line for line in text.splitlines() if line.startswith("✓ ") and not line.startswith("✓ All ")]
    m = re.search(
        r"^✓ All (\d+) statements this lesson makes about its outputs held in this run\.$", text, re.M
    )
    assert m, f"{name} does not end with lesson.summary() saying every statement held"
    assert int(m.group(1)) == len(held) >= 2, (name, m.group(0), len(held))


def test_no_startup_noise_no_missed_pace_no_build_paths(lesson_nb):
    name, _nb, text = lesson_nb
    noise = [n for n in STARTUP_NOISE if n in text]
    assert not noise, f"{name} shows TensorFlow's start-up noise: {noise}"
    assert "could not keep" not in text, f"{name} was committed from a run that missed its pace"
    paths = sorted(set(BUILD_PATHS.findall(text)))
    assert not paths, f"{name} prints paths of the machine that ran it: {paths}"


def test_security_lines_say_what_this_version_does(lesson_nb):
    """A committed "Security:" line must be what tfmagic says now: the kernel's own TensorFlow server
    is kept on loopback (issue 22 item 2), not "on every interface" as before that change."""
    name, _nb, text = lesson_nb
    lines = [line for line in text.splitlines() if line.startswith("Security:")]
    stale = [line for line in lines if "this kernel also serves TensorFlow on every interface" in line]
    assert not stale, f"{name} was committed before the kernel's server was kept on loopback: {stale[0]}"
    for line in lines:
        assert "this kernel serves TensorFlow on 127.0.0.1 only" in line, f"{name}: {line}"
        # and, since issue 24 item 0, to this user's processes only, as are local tasks
        mine = re.search(
            r"kernel serves TensorFlow on 127\.0\.0\.1 only( \(port \d+\))?, to your own processes only", line
        )
        assert mine, f"{name} was committed before the peer check: {line}"
        assert "by anyone on this machine" not in line, f"{name} was committed before the peer check: {line}"
