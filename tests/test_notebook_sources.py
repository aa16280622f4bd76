"""Each notebook in notebooks/ is written from its jupytext percent script, and the two agree.

`notebooks/NN_name.py` is the source a reviewer and ruff read; `notebooks/NN_name.ipynb` is what
readers open, with the outputs of a real run.  Their code and markdown cells must be the same, so
that editing one without the other (then `jupytext --sync`) fails here.  Outputs are not compared:
they come from executing the notebook, not from the source.
"""

from __future__ import annotations

import difflib
from pathlib import Path

import jupytext
import pytest

pytestmark = pytest.mark.unit
NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
PAIRING = "ipynb,py:percent"


def _cells(nb) -> list[tuple[str, str]]:
    return [(c.cell_type, c.source) for c in nb.cells if c.cell_type in ("code", "markdown")]


def _first_difference(ipynb: list[tuple[str, str]], source: list[tuple[str, str]]) -> str:
    for i, (a, b) in enumerate(zip(ipynb, source)):
        if a != b:
            diff = difflib.unified_diff(
                f"[{a[0]}]\n{a[1]}".splitlines(),
                f"[{b[0]}]\n{b[1]}".splitlines(),
                "ipynb",
                "py",
                lineterm="",
            )
            return f"cell {i} differs:\n" + "\n".join(diff)
    return f"the ipynb has {len(ipynb)} cells, the source {len(source)}"


def test_every_notebook_has_a_source_and_every_source_a_notebook():
    notebooks = {p.stem for p in NOTEBOOKS.glob("*.ipynb")}
    sources = {p.stem for p in NOTEBOOKS.glob("*.py")}
    assert notebooks, "no notebooks found"
    assert not notebooks - sources, f"notebooks without a source .py: {sorted(notebooks - sources)}"
    assert not sources - notebooks, f"sources without a notebook .ipynb: {sorted(sources - notebooks)}"


@pytest.mark.parametrize("name", sorted(p.stem for p in NOTEBOOKS.glob("*.ipynb")))
def test_notebook_matches_its_source(name):
    ipynb, source = NOTEBOOKS / f"{name}.ipynb", NOTEBOOKS / f"{name}.py"
    assert source.exists(), f"{source.name} is missing"
    nb = jupytext.read(ipynb)
    src = jupytext.read(source, fmt="py:percent")
    for path, which in ((ipynb, nb), (source, src)):
        formats = which.metadata.get("jupytext", {}).get("formats")
        assert formats == PAIRING, f"{path.name} is not paired ({formats!r}); expected formats: {PAIRING}"
    a, b = _cells(nb), _cells(src)
    assert a == b, (
        f"{ipynb.name} and {source.name} differ in code or markdown; edit the .py, then run "
        f"`jupytext --sync notebooks/{ipynb.name}` and re-execute the notebook.\n" + _first_difference(a, b)
    )
