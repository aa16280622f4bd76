"""The server's reading of what kernels published (plain files; no server, no kernel)."""

from __future__ import annotations

import json
import os

import pytest

from tfmagic import publish
from tfmagic.server import records

pytestmark = pytest.mark.unit


def test_a_records_other_files_are_not_records(tmp_path):
    """'ID.frame' named ID's frame.json: the page answered 200 for it and created ID.frame.watching."""
    rid = f"{os.getpid()}-c1"
    rec = {"id": rid, "kernel_pid": os.getpid(), "kernel_started": publish.process_start(os.getpid())}
    (tmp_path / f"{rid}.json").write_text(json.dumps(rec))
    (tmp_path / f"{rid}.frame.json").write_text(json.dumps({"frame": 3}))
    assert records.read(tmp_path, rid)["id"] == rid
    assert records.read(tmp_path, f"{rid}.frame") is None
    assert [r["id"] for r in records.read_all(tmp_path, watch=False)] == [rid]
    assert not list(tmp_path.glob("*.watching"))
