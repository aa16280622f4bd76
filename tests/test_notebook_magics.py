"""Every magic a lesson's text tells the student to type parses as written (exercises included).

A magic quoted in prose is never run by the notebook's own run, so a wrong option there
(`%tf_cluster slow worker:1 8` for `--factor 8`) would only show when a student types it.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import nbformat
import pytest
from IPython.core.error import UsageError
from IPython.core.magic_arguments import parse_argstring

pytestmark = pytest.mark.unit
NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
QUOTED = re.compile(r"`(%tf_(?:cluster|train|experiment)\b[^`]*)`")


def quoted_magics() -> list[tuple[str, str]]:
    found = []
    for path in sorted(NOTEBOOKS.glob("0*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "markdown":
                found += [(path.name, m) for m in QUOTED.findall(cell.source.replace("\n#", " "))]
    return found


def parse(line: str) -> None:
    from tfmagic.magics.cluster import VERBS
    from tfmagic.magics.experiments import ExperimentMagics
    from tfmagic.magics.training import TrainingMagics

    magic, _, rest = line.partition(" ")
    rest = " ".join(rest.split())
    if re.fullmatch(r"--[a-z-]+", rest):
        return  # the prose names an option (`%tf_train --events`), not a command to type
    if magic == "%tf_cluster":
        name, _, args = rest.partition(" ")
        if not name or name in ("-h", "--help", "help", "?"):
            return
        verb = VERBS.verbs.get(name)
        assert verb is not None, f"{line!r}: no verb {name!r}"
        verb.parser("tf_cluster").parse_argstring(args)
    elif magic == "%tf_train":
        parse_argstring(TrainingMagics.tf_train, rest)
    elif magic == "%tf_experiment":
        parse_argstring(ExperimentMagics.tf_experiment, rest)
    shlex.split(rest)


@pytest.mark.parametrize(("notebook", "line"), quoted_magics())
def test_a_magic_quoted_in_a_lesson_parses(notebook, line):
    try:
        parse(line)
    except UsageError as exc:
        pytest.fail(f"{notebook}: `{line}` does not parse: {exc}")


def test_the_lessons_quote_magics():
    assert len(quoted_magics()) >= 15
