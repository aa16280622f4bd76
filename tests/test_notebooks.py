"""Every notebook in notebooks/ runs top to bottom in a real kernel, and says true things."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, DeadKernelError

from .conftest import assert_gone, beside, hold_other_lanes, load_per_core, task_processes
from .kernelutil import KernelAborted, aborted, kernel_log_of, plain, record_abort, why_it_died

pytestmark = [pytest.mark.notebook, pytest.mark.cluster]
ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "test-artifacts" / "notebooks"


#: Binder guarantees 1 GB and allows 2 GB; the issue's ceiling for kernel + cluster, per notebook
PEAK_LIMIT = 1.8e9


def execute(
    name: str,
    env: dict | None = None,
    saved_as: str | None = None,
    peak_limit: float | None = PEAK_LIMIT,
    quiet_rerun: bool = True,
) -> nbformat.NotebookNode:
    """Run a notebook in a real kernel; its peak memory (PSS of the kernel and every process below
    it, sampled twice a second) is checked against :data:`PEAK_LIMIT` and kept in
    ``test-artifacts/notebooks/memory.json`` (the table in docs/server.md comes from ``bench/notebook_memory.py``).

    A kernel that aborts inside TensorFlow (issue 22 item 11: TensorFlow's eager runtime, about once
    in a CI run, in a kernel that trains; the cause is not found yet) is recorded in
    ``test-artifacts/kernel-aborts.log`` with the stacks it left, its tasks must end with it, and the
    notebook runs once more; a second death, or any other, fails.

    The one notebook runner of the tests: ``env`` is the kernel's environment (default this
    process's; spares off and lessons strict are added), ``saved_as`` the executed copy's name in
    test-artifacts/notebooks/, ``peak_limit`` None where the run's processes are not Binder's (a
    local Spark's JVM is a child of the kernel), ``quiet_rerun`` False where the notebook measures no
    time, so its rerun need not wait for the other lane's test to end (test_lanes tests the hold)."""
    import json

    before = set(task_processes())
    try:
        nb, peak = _run(name, env, saved_as or name)
    except KernelAborted as first:
        record_abort(f"notebook {name}", str(first))
        assert_gone(set(task_processes()) - before)  # no orphan when the kernel aborts, either
        nb, peak = _run(name, env, saved_as or name)
    except CellExecutionError as first:
        if "LessonCheckFailed" not in str(first) or LESSON_HELD_BACK not in str(first):
            raise
        # What the lesson tells a student whose run contradicted it ("if the machine was busy, run
        # the cell again"), done once for the whole notebook and kept in the test summary and the
        # artifacts: a check that fails twice fails the test.
        record_lesson_rerun(name, str(first))
        if quiet_rerun:
            hold_other_lanes(f"notebook {name}")
        assert_gone(set(task_processes()) - before)
        try:
            nb, peak = _run(name, env, saved_as or name)
        except CellExecutionError as second:
            if "LessonCheckFailed" not in str(second) or LESSON_HELD_BACK not in str(second):
                raise
            held_back = [ln.strip() for ln in plain(str(second)).splitlines() if LESSON_HELD_BACK in ln]
            pytest.fail(
                f"{name}: a lesson check did not hold twice (load {load_per_core():.1f} per core; {beside()}): "
                + (held_back[-1] if held_back else str(second)[-2000:]),
                pytrace=False,
            )
    assert_gone(set(task_processes()) - before)
    record = ARTIFACTS / "memory.json"
    peaks = json.loads(record.read_text()) if record.exists() else {}
    peaks[saved_as or name] = peak
    record.write_text(json.dumps(peaks, indent=1))
    if peak_limit is not None:
        assert 0 < peak <= peak_limit, (
            f"{name} peaked at {peak / 1e9:.2f} GB (PSS), over {peak_limit / 1e9:g} GB"
        )
    return nb


#: how a lesson check that the run contradicted reads (tfmagic.lesson), as opposed to an unreadable figure
LESSON_HELD_BACK = "did not hold in this run"


def record_lesson_rerun(name: str, why: str) -> None:
    """Keep a lesson check a loaded run contradicted, and say in the test summary that the notebook
    ran again: a notebook that passes on its second run must not hide its first."""
    import time
    import warnings

    lines = [
        line
        for line in plain(why).splitlines()
        if LESSON_HELD_BACK in line and "LessonCheckFailed" not in line
    ]
    load = load_per_core()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with open(ARTIFACTS / "lesson-reruns.log", "a") as log:
        log.write(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} {name} (load {load:.1f} per core; {beside()})\n")
        log.write("\n".join(lines[-5:]) + "\n")
    warnings.warn(
        f"{name}: a lesson check did not hold (load {load:.1f} per core) and the notebook ran again: "
        + (lines[-1].strip() if lines else "see test-artifacts/notebooks/lesson-reruns.log"),
        stacklevel=2,
    )


def _run(name: str, env: dict | None, saved_as: str) -> tuple[nbformat.NotebookNode, float]:
    """One run of a notebook: what it left, and its peak memory."""
    from tfmagic.experiments.base import MemoryWatch

    nb = nbformat.read(ROOT / "notebooks" / name, as_version=4)
    env = dict(
        os.environ if env is None else env, TFMAGIC_SPARES="0", TFMAGIC_LESSON_STRICT="1"
    )  # strict: a contradicted lesson fails
    env["TFMAGIC_TEST_STARTED_BY"] = env.pop("PYTEST_CURRENT_TEST", "")  # for tests/cpu_by_process.py
    client = NotebookClient(
        nb,
        timeout=600,
        kernel_name="python3",
        resources={"metadata": {"path": str(ROOT / "notebooks")}},
        store_widget_state=True,
    )
    watch = MemoryWatch(every=0.5, pid=lambda: kernel_pid(client))
    pids: list = []  # the kernel's, kept for after its death (the client forgets it)
    client.on_notebook_start = lambda notebook: pids.append(kernel_pid(client))
    # The kernel's own stderr (how it died, when it does) to a file that a failure quotes.
    stderr = tempfile.NamedTemporaryFile(  # noqa: SIM115 - closed below, kept when a kernel died
        prefix="tfmagic-notebook-kernel-", suffix=".stderr", delete=False
    )
    try:
        with watch:
            client.execute(env=env, stderr=stderr)
    except DeadKernelError as exc:
        stderr.flush()
        text = Path(stderr.name).read_text(errors="replace") + "\n" + kernel_log_of(pids[0] if pids else None)
        why = f"{name}: the kernel died; {why_it_died(text)}its stderr: {stderr.name}"
        raise (KernelAborted if aborted(text) else AssertionError)(why) from exc
    finally:
        stderr.close()
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, ARTIFACTS / saved_as)
    Path(stderr.name).unlink()
    return nb, watch.peak


def kernel_pid(client: NotebookClient) -> int | None:
    """The pid of the kernel ``client`` started (None before it has one)."""
    km = getattr(client, "km", None)
    process = getattr(getattr(km, "provisioner", None), "process", None)
    return getattr(process, "pid", None)


def outputs(nb, skip: str | None = None, only: str | None = None) -> str:
    """The text a reader sees; ``skip`` leaves out cells whose source contains it, ``only`` keeps those alone."""
    text = []
    for cell in nb.cells:
        if skip and skip in cell.get("source", ""):
            continue
        if only and only not in cell.get("source", ""):
            continue
        previous = None
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                if previous is not None and previous.get("name") == out.get("name"):
                    # one stream cut in two (the kernel flushed between the pieces of one print):
                    # a notebook shows them as one text, and so does this
                    text[-1] += out["text"]
                else:
                    text.append(out["text"])
                previous = out
                continue
            previous = None
            if "data" in out:
                text.append(out["data"].get("text/plain", ""))
            elif out.get("output_type") == "error":
                text.append("\n".join(out.get("traceback", [])))
    return "\n".join(text)


def test_00_index():
    nb = execute("00_index.ipynb")
    text = outputs(nb)
    assert re.search(r"tfmagic [\d.]+, TensorFlow [\d.]+, \d+ CPU cores", text), text
    assert re.search(r"memory: [\d.]+ GB available now, at most [\d.]+ GB \(", text), text
    links = re.findall(r"\]\((\d\d_[a-z_]+\.ipynb)\)", "".join(c.source for c in nb.cells))
    on_disk = sorted(p.name for p in (ROOT / "notebooks").glob("0[1-9]_*.ipynb"))
    assert sorted(set(links)) == on_disk, "the index lists every notebook, and only those"


def test_01_cluster_basics():
    nb = execute("01_cluster_basics.ipynb")
    text = outputs(nb)
    assert "Cluster c1 started: 2 ps, 2 workers" in text
    assert "w lives on /job:ps/replica:0/task:0" in text and "b lives on /job:ps/replica:0/task:1" in text
    assert "y computed on /job:worker/replica:0/task:1" in text
    m = re.search(r"w = ([\d.]+), b = ([\d.]+), loss", text)
    assert m and abs(float(m.group(1)) - 2) < 0.01 and abs(float(m.group(2)) - 10) < 0.01, text[-3000:]
    assert "steps per worker: {'worker:0': 100, 'worker:1': 100}" in text
    # the worker's log has what its tf.print wrote (odd steps ran there), not TensorFlow's noise
    log1 = outputs(nb, only="%tf_cluster logs worker:1")
    for step in (25, 75, 125, 175):
        assert re.search(rf"^step {step} loss [\d.e-]+ w [\d.]+ b [\d.]+$", log1, re.M), log1
    assert not re.search(r"^step (0|50|100|150) loss", log1, re.M), (
        "worker:0's steps are not in worker:1's log"
    )
    assert "device_count" not in log1 and ".cc:" not in log1 and "left out" in log1
    # the map: the model's variables over both ps, and both workers ran steps
    assert re.search(r"ps:0: \d+ variables", text) and re.search(r"ps:1: \d+ variables", text), text
    assert re.search(r"steps run: worker:0 \d+.*worker:1 \d+", text), text
    log0 = outputs(nb, only="%tf_cluster logs worker:0")
    assert re.search(
        r"tfmagic: run \S+ \(async\): ended at update 300, final held-out loss [\d.]+; \d+ of its", log0
    )
    m = re.search(r"TF1 session on grpc://127.0.0.1:\d+ -> w = ([\d.]+), b = ([\d.]+)", text)
    assert m and abs(float(m.group(1)) - 2) < 0.05 and abs(float(m.group(2)) - 10) < 0.05
    assert "Stopped cluster c1 (4 tasks)" in text
    for noise in ("E0000", "CloseContext", "Traceback"):
        assert noise not in text
    assert "<details>" in "".join(c.source for c in nb.cells if c.cell_type == "markdown")


def _number(text: str, pattern: str) -> float:
    m = re.search(pattern, text)
    assert m, f"{pattern!r} not found in:\n{text[-3000:]}"
    return float(m.group(1))


def test_02_sync_vs_async():
    text = outputs(execute("02_sync_vs_async.ipynb"))
    assert "Traceback" not in text
    assert "def run(self, first: int, last: int)" in text and "def work(self, w: Worker)" in text, "the loops"
    # paced, 3 workers: async makes about 3 updates per sync update
    assert 2.4 < _number(text, r"async applies ([\d.]+)x as many updates per second") < 3.6
    assert "examples consumed for 300 updates: sync 28800, async 9600" in text
    assert re.search(r"sync\s+300\s+28800\s+[\d.]+", text), "the table says examples and warm-up"
    # identical machines hardly wait; with jitter, the slowest of three sets each update
    waits = [
        float(w)
        for w in re.findall(r"^sync  worker:\d: busy \d+%, waiting at the barrier (\d+)%", text, re.M)
    ]
    assert len(waits) == 3 and max(waits) < 10, waits
    jitter_ms = _number(text, r"sync with jitter: (\d+) ms per update")
    plain_ms = _number(text, r"sync with jitter: \d+ ms per update \(median\), without: (\d+) ms")
    assert jitter_ms > 1.1 * plain_ms
    jitter_waits = [
        float(w)
        for w in re.findall(r"jittery sync worker:\d: busy \d+%, waiting at the barrier (\d+)%", text)
    ]
    assert max(jitter_waits) >= 5, jitter_waits
    # what the markdown says of the three panels
    per = {
        axis: (
            _number(text, rf"held-out loss after [\d.]+ {axis}[^:]*: sync ([\d.]+)"),
            _number(text, rf"held-out loss after [\d.]+ {axis}[^:]*: sync [\d.]+, async ([\d.]+)"),
        )
        for axis in ("updates", "examples", "s of training")
    }
    sync_u, async_u = per["updates"]
    assert 0.75 < async_u / sync_u < 1.33, per
    assert per["examples"][1] < 0.8 * per["examples"][0], per
    assert per["s of training"][1] < 0.8 * per["s of training"][0], per
    assert _number(text, r"accuracy at the end: sync ([\d.]+)") > 0.9
    assert _number(text, r"accuracy at the end: sync [\d.]+, async ([\d.]+)") > 0.9
    stale = [float(m) for m in re.findall(r"^worker:\d: mean staleness ([\d.]+)", text, re.M)]
    assert len(stale) == 3 and all(1.3 <= m <= 2.5 for m in stale), stale  # as the lesson's own checks
    assert 1.6 <= _number(text, r"all gradients: mean staleness ([\d.]+)") <= 2.4
    assert "of its gradients were fresh" in text


def test_03_stragglers_and_failures():
    nb = execute("03_stragglers_and_failures.ipynb")
    text = outputs(nb)
    state = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    images = [m for m in state.values() if m["model_name"] == "ImageModel"]
    assert images, "the dashboard's widgets are saved with the notebook"
    assert any(m.get("buffers") or m["state"].get("value") for m in images), "with its last frame"
    headers = [
        m["state"]["value"]
        for m in state.values()
        if m["model_name"] == "HTMLModel" and "tfmagic-header" in m["state"].get("value", "")
    ]
    assert headers and re.search(r"async</b>: done, 9\d\d updates", headers[-1]), headers
    # without widget state (nbconvert to HTML, GitHub) the output itself holds the last frame
    dash = [
        out["data"]
        for cell in nb.cells
        if "%tf_train" in cell.get("source", "")
        for out in cell.get("outputs", [])
        if "application/vnd.jupyter.widget-view+json" in out.get("data", {})
    ]
    assert dash and re.search(r"async: 9\d\d updates", dash[-1]["text/plain"]), (
        dash and dash[-1]["text/plain"]
    )
    import copy

    from nbconvert import HTMLExporter

    bare = copy.deepcopy(nb)
    bare.metadata.pop("widgets", None)
    page, _ = HTMLExporter().from_notebook_node(bare)
    png = dash[-1]["image/png"].replace("\n", "")
    assert f"data:image/png;base64,{png[:200]}" in page, "nbconvert's HTML shows the last frame"
    assert "Traceback" not in text and "retracing" not in text
    # paced: the textbook's figures, within 10 %
    assert 3.6 < _number(text, r"sync step time with worker:2 four times slower: ([\d.]+)x") < 4.4
    assert 0.68 < _number(text, r"async throughput with worker:2 four times slower: ([\d.]+)x") < 0.83
    others = [
        float(v) for v in re.findall(r"async worker:[01]: [\d.]+ steps/s, ([\d.]+)x its unslowed pace", text)
    ]
    assert len(others) == 2 and min(others) > 0.9, others
    assert 0.2 < _number(text, r"async worker:2: [\d.]+ steps/s, ([\d.]+)x its unslowed pace") < 0.34
    shares = dict(
        (m[0], (float(m[1]), float(m[2])))
        for m in re.findall(r"worker:2 slowed: (worker:\d) busy (\d+)%, waiting at the barrier (\d+)%", text)
    )
    assert shares["worker:2"][0] > 80 and all(shares[w][1] > 50 for w in ("worker:0", "worker:1")), shares
    assert 0.9 < _number(text, r"sync \+ 1 backup worker, worker:2 slowed x4: ([\d.]+)x") < 1.15
    assert re.search(r"dropped as stale, per worker: \{[^}]*'worker:2': \d+", text)
    assert _number(text, r"worker:2 made (\d+) steps after it rejoined") > 0
    assert re.search(r"update \d+: kill", text) and re.search(r"update \d+: rejoin", text)
    assert _number(text, r"([\d.]+) s after the kill: sync training needs all 3 workers") < 3


def test_04_between_graph():
    text = outputs(execute("04_between_graph.ipynb"))
    assert "Traceback" not in text and "This could happen" not in text
    assert "[worker:1] I am worker:1, serving grpc://127.0.0.1:" in text
    assert "[ps:0] tfmagic: server.join() returns at once" in text
    rows = {
        name: _number(text, re.escape(name) + r"\s+w = [\d.]+\s+b = [\d.]+\s+held-out loss ([\d.]+)")
        for name in (
            "all-reduce sync (MWMS, between-graph)",
            "ps sync (seed 000, SyncReplicasOptimizer)",
            "ps async (seed 000)",
            "ps async (ParameterServerStrategy, TF2)",
        )
    }
    assert "weight lives on /job:ps/replica:0/task:0" in text
    assert re.search(r"150 scheduled steps in [\d.]+ s: w = [\d.]+, b = [\d.]+", text), text
    engine = _number(text, r"kernel-driven sync \(tfmagic.train\)\s+held-out loss ([\d.]+)")
    assert all(v < 0.0115 for v in rows.values()), rows  # all at the noise floor (0.01)
    assert rows["all-reduce sync (MWMS, between-graph)"] == pytest.approx(engine, abs=1e-5)


def test_06_classic_experiments():
    text = outputs(execute("06_classic_experiments.ipynb"))
    assert "Traceback" not in text and "UsageError" not in text
    for name in ("stragglers", "backup-workers", "staleness", "noise", "ssp", "scaling"):
        assert re.search(rf"^{re.escape(name)}\s+holds\s", text, re.M), f"{name}:\n{text[-3000:]}"
    assert _number(text, r"peak memory of this notebook's experiments: ([\d.]+) GB") <= 1.8
    assert _number(text, r"longest experiment: ([\d.]+) s") <= 150


def test_08_from_the_seeds():
    text = outputs(execute("08_from_the_seeds.ipynb"))
    assert "Traceback" not in text and "UsageError" not in text
    assert re.search(
        r"^✓ All \d+ statements this lesson makes about its outputs held in this run\.$", text, re.M
    )
    assert "histograms written: weights/" in text


def test_09_a_datacenter_on_your_laptop():
    # 2 ps + 32 workers and the kernel: Binder's 2 GB, the lesson's own claim (the others keep to 1.8)
    text = outputs(execute("09_a_datacenter_on_your_laptop.ipynb", peak_limit=2.0e9))
    assert "Traceback" not in text and "UsageError" not in text
    assert re.search(
        r"^✓ All \d+ statements this lesson makes about its outputs held in this run\.$", text, re.M
    )
    assert re.search(r"^34 tasks in [1-4] processes", text, re.M), text[:3000]
    assert "killed (modelled) | running" in text, "a killed worker of a shared process, beside a live one"
    assert "worker:3 it is dead: killed on purpose, its server cut off" in text


def test_07_inside_the_cluster():
    text = outputs(execute("07_inside_the_cluster.ipynb"))
    assert "Traceback" not in text and "UsageError" not in text
    assert re.search(r"ps:0: \d+ variables, .*9\d% of the ps bytes", text), text[:3000]
    assert "steps run: worker:0" in text and "worker:1" in text
    assert "ps-bottleneck (seed 0): the claim holds" in text, text[-4000:]
    # the experiment runs here once per CI (test_experiments leaves it to this lesson)
    assert 1.6 <= _number(text, r"1 ps over 2 ps ([\d.]+)") <= 2.5
    assert "it is stopped (SIGSTOP" in text and "kill -CONT" in text
    # a worker killed under async: its numbers freeze, the other's grow, the run goes on
    rows = {
        m.group(1): [float(x) for x in m.groups()[1:]]
        for m in re.finditer(
            r"^(worker:[01])\s+(\d+) ->\s+(\d+)\s+([\d.]+) ->\s+([\d.]+) MB\s+([\d.]+) ->\s+([\d.]+) MB",
            text,
            re.M,
        )
    }
    assert set(rows) == {"worker:0", "worker:1"}, text[-3000:]
    s0, s1, a0, a1, _, _ = rows["worker:0"]
    assert s1 > s0 + 10 and a1 > a0, rows
    k0, k1, b0, b1, _, _ = rows["worker:1"]
    # steps in flight at the kill are recorded after it; that none started later, the notebook checks
    assert k0 > 10 and k1 - k0 <= 16 and b1 - b0 < 0.05 * b0 + 0.01, rows
    assert "the run is still training" in text


def _flaky_lesson(tmp_path, fails: int) -> str:
    """A notebook whose one lesson check fails on its first ``fails`` runs, then holds."""
    runs = tmp_path / "runs"
    code = (
        "from pathlib import Path\n"
        "from tfmagic import lesson\n"
        f"runs = Path({str(runs)!r})\n"
        "n = len(runs.read_text()) if runs.exists() else 0\n"
        "runs.write_text('x' * (n + 1))\n"
        f"lesson.expect(n, at_least={fails}, claim='the run held this time')\n"
    )
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = tmp_path / "flaky.ipynb"
    nbformat.write(nb, path)
    return str(path)


def test_a_lesson_a_loaded_run_contradicted_runs_again_once_and_says_so(tmp_path):
    with pytest.warns(UserWarning, match="a lesson check did not hold .* ran again"):
        nb = execute(_flaky_lesson(tmp_path, fails=1), saved_as="flaky-lesson.ipynb", quiet_rerun=False)
    assert "✓ the run held this time" in outputs(nb)
    assert "the run held this time" in (ARTIFACTS / "lesson-reruns.log").read_text()


def test_a_lesson_contradicted_twice_fails(tmp_path):
    with pytest.warns(UserWarning), pytest.raises(pytest.fail.Exception, match=r"did not hold twice \(load"):
        execute(_flaky_lesson(tmp_path, fails=2), saved_as="flaky-lesson.ipynb", quiet_rerun=False)
