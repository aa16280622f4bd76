"""The Slurm backend against a real Slurm (issue 25): munged, slurmctld and slurmd started here.

A start is one ``sbatch`` job whose tasks dial back to this process; the cluster trains as any
other; ``stop``, the owner's ``kill -9`` (running or still queued) and a job that can never start
all leave Slurm's queue empty and no task process behind; a job that waits says Slurm's reason.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

import pytest

import tfmagic
from tfmagic.errors import BadArgument, ClusterStartError, TfmagicError

from . import slurmhost
from .conftest import assert_gone, magic_refusal, poll_for, task_processes
from .slurmhost import skip_reason

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    why = skip_reason()
    if why:
        pytest.skip(why)
    with slurmhost.running(tmp_path_factory.mktemp("slurm")) as private:
        yield private


def test_a_cluster_is_one_slurm_job_that_trains_and_stop_empties_the_queue(slurm, no_leaks):
    seen: list[tuple[str, str, str]] = []
    cluster = tfmagic.SlurmCluster(ps=1, workers=2, partition="debug", time="10", start_timeout=120)
    try:
        cluster.start(progress=lambda task, stage, detail: seen.append((task, stage, detail)))
        (job,) = cluster.launcher.job_ids
        assert slurm.queue() == [f"{job} RUNNING"]
        status = cluster.status()
        assert all(f"Slurm job {job} on {slurm.node}" in row.note for row in status.tasks), status
        assert f"tasks run as Slurm job(s) {job}" in str(status)
        pids = {p.task_pid for p in cluster.procs.values()}
        assert pids <= set(task_processes())  # tasks of this run, under Slurm's slurmstepd
        run = tfmagic.train(cluster, mode="async", model="digits", steps=40, lr=0.05)
        assert run.steps == 40 and set(run.by_task()) == {"worker:0", "worker:1"}
        # %%tf_px: code goes down the relayed channel; each task's parent is its relay, under slurmstepd
        from tfmagic.px import run_px

        code = "import os\nprint(job_name, task_index, os.environ['SLURM_JOB_ID'], flush=True)\nos.getppid()"
        outcomes = run_px(cluster, code).wait(60)
        for task, proc in cluster.procs.items():
            outcome = outcomes[str(task)]
            assert outcome.status == "ok" and outcome.stdout == f"{task.job} {task.index} {job}\n", outcome
            assert outcome.result == cluster.launcher._by_pid[proc.pid].relay_pid
        assert {stage for _, stage, _ in seen} >= {"spawned", "up"}
    finally:
        cluster.stop()
    poll_for(lambda: not slurm.queue(), 30, what="Slurm's queue to empty after stop")
    assert_gone(pids)


_OWNER = textwrap.dedent(
    """
    import sys, time, tfmagic
    cluster = tfmagic.SlurmCluster(ps=1, workers=1, sbatch=sys.argv[1:], start_timeout=300)
    cluster.start()
    print("up", *[p.task_pid for p in cluster.procs.values()], flush=True)
    time.sleep(600)
    """
)


def _owner(*sbatch: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", _OWNER, *sbatch], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )


def test_the_owner_killed_ends_its_running_job_and_tasks(slurm):
    owner = _owner()
    try:
        line = poll_for(lambda: owner.stdout.readline(), 120, what="the owner's cluster to start")
        pids = [int(p) for p in line.split()[1:]]
        assert len(pids) == 2 and len(slurm.queue()) == 1
        owner.send_signal(signal.SIGKILL)
        owner.wait(10)
        poll_for(lambda: not slurm.queue(), 30, what="the job of a killed owner to end")
        assert_gone(pids)
    finally:
        owner.kill()
        owner.wait(10)


def test_a_queued_job_is_cancelled_when_its_owner_dies_and_a_waiting_start_says_why(slurm, no_leaks):
    owner = _owner("--begin=now+1hour")  # queued: no relay inside it yet to notice its owner is gone
    try:
        poll_for(lambda: [j for j in slurm.queue() if "PENDING" in j], 60, what="the owner's job to queue")
        owner.send_signal(signal.SIGKILL)
        owner.wait(10)
        poll_for(lambda: not slurm.queue(), 30, what="the queued job of a killed owner to be cancelled")
    finally:
        owner.kill()
        owner.wait(10)
    cluster = tfmagic.SlurmCluster(ps=1, workers=1, sbatch=["--begin=now+1hour"], connect_timeout=4)
    with pytest.raises(ClusterStartError) as info:
        cluster.start()
    message = str(info.value)
    assert "\n" not in message and "was still pending after 4 s: BeginTime" in message, message
    poll_for(lambda: not slurm.queue(), 30, what="the job of a start that gave up to be cancelled")


def test_a_job_slurm_can_never_start_fails_at_once_with_its_reason(slurm, no_leaks):
    cluster = tfmagic.SlurmCluster(
        ps=1, workers=20, partition="debug", start_timeout=120
    )  # 21 tasks, 8 cores
    t0 = time.monotonic()
    with pytest.raises(ClusterStartError) as info:
        cluster.start()
    message = str(info.value)
    assert "can never start as asked (PartitionConfig" in message and "\n" not in message, message
    assert time.monotonic() - t0 < 30
    poll_for(lambda: not slurm.queue(), 30, what="the refused job to leave the queue")


def test_bad_slurm_requests_are_one_line_each(slurm):
    with pytest.raises(BadArgument, match="not a Slurm time limit"):
        tfmagic.SlurmCluster(time="1h")
    with pytest.raises(BadArgument, match="no partition 'nope'; it has debug"):
        tfmagic.SlurmCluster(partition="nope")
    with pytest.raises(BadArgument, match="not an sbatch option"):
        tfmagic.SlurmCluster(sbatch=["gres=gpu:1"])
    with pytest.raises(BadArgument, match="processes= .* local clusters only"):
        tfmagic.SlurmCluster(processes=2)
    assert not slurm.queue()


@pytest.mark.unit
def test_without_slurm_the_backend_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(TfmagicError) as info:
        tfmagic.SlurmCluster()
    assert str(info.value).startswith("no sbatch on the PATH: the slurm backend needs Slurm; install")
    from tfmagic.backends import ClusterRequest, check

    with pytest.raises(TfmagicError, match="no sbatch on the PATH"):
        check(ClusterRequest(backend="slurm"))


@pytest.mark.unit
@pytest.mark.parametrize("good", ["90", "1:30", "1:30:00", "2-12", "2-12:30", "2-12:30:00"])
def test_slurms_time_formats_are_accepted(good):
    from tfmagic.launchers.slurm import check_time

    assert check_time(good) == good


def test_scancel_from_outside_ends_training_with_one_line_that_names_the_job(slurm, no_leaks):
    cluster = tfmagic.SlurmCluster(ps=1, workers=2, start_timeout=120)
    try:
        cluster.start()
        (job,) = cluster.launcher.job_ids
        run = tfmagic.train(cluster, mode="async", model="digits", steps=10**6, lr=0.05, block=False)
        poll_for(lambda: run.history.steps > 10, 60, what="the run's first updates")
        assert slurm.run("scancel", job).returncode == 0
        with pytest.raises(tfmagic.TrainingError) as info:
            run.wait(60)
        message = str(info.value)
        assert f"Slurm ended job {job} (CANCELLED)" in message and "start the cluster again" in message, (
            message
        )
        assert "\n" not in message
        notes = {row.task: row.note for row in cluster.status().tasks}
        assert all(f"Slurm ended job {job} (CANCELLED)" in n for n in notes.values()), notes
    finally:
        cluster.stop()
    poll_for(lambda: not slurm.queue(), 30, what="the cancelled job to leave the queue")


def test_workers_own_sbatch_options_put_them_in_a_job_of_their_own(slurm, no_leaks):
    """worker_sbatch (GPUs, say) applies to the workers only: the ps runs in a job without them."""
    cluster = tfmagic.SlurmCluster(ps=1, workers=2, worker_sbatch=["--cpus-per-task=2"], start_timeout=120)
    try:
        cluster.start()
        jobs = cluster.launcher.job_ids
        assert len(jobs) == 2 and len(slurm.queue()) == 2
        cpus = {}
        for job in jobs:
            fields = dict(
                kv.split("=", 1)
                for kv in slurm.run("scontrol", "show", "job", "-o", job).stdout.split()
                if "=" in kv
            )
            cpus[fields["NumTasks"]] = fields["CPUs/Task"]
        assert cpus == {"1": "1", "2": "2"}, (
            cpus
        )  # the ps's job of one task, the workers' of two at 2 cores each
        notes = {str(row.task): row.note for row in cluster.status().tasks}
        assert (
            notes["ps:0"].split(" on ")[0]
            != notes["worker:0"].split(" on ")[0]
            == notes["worker:1"].split(" on ")[0]
        )
        run = tfmagic.train(cluster, mode="sync", model="digits", steps=10, lr=0.05)
        assert run.steps == 10
    finally:
        cluster.stop()
    poll_for(lambda: not slurm.queue(), 30, what="both jobs to end")


@pytest.mark.parametrize(
    "line, said",
    [
        ("start --backend slurm --time 1h", "time='1h' is not a Slurm time limit"),
        ("start --partition debug", "--partition is for --backend slurm"),
        ("start --worker-sbatch --gpus-per-task=1", "--worker-sbatch is for --backend slurm"),
        ('start --sbatch "--qos=debug --exclusive"', "--sbatch is for --backend slurm"),
        ('start --backend slurm --worker-sbatch "--gpus-per-task=1 qos"', "'qos' is not an sbatch option"),
        ("start --backend slurm --partition nope", "Slurm has no partition 'nope'"),
        ("start --backend slurm --sbatch gres=gpu:1", "'gres=gpu:1' is not an sbatch option"),
        ('start --backend slurm --net "ps:0 rate=fast"', "'fast' is not a rate"),
        ("start --backend slurm --processes 2", "processes is for the local backend"),
    ],
)
def test_the_magic_refuses_a_bad_slurm_start_in_one_line_and_queues_nothing(slurm, line, said):
    message = magic_refusal(line)
    assert said in message and not slurm.queue(), message


def test_the_magic_starts_a_slurm_job_with_quoted_sbatch_options_and_stops_it(slurm, no_leaks):
    from IPython.core.interactiveshell import InteractiveShell

    from tfmagic import session
    from tfmagic.magics.cluster import ClusterMagics

    magics = ClusterMagics(shell=InteractiveShell.instance())
    sess = session.default()
    previous, sess.cluster = sess.cluster, None
    try:
        magics.tf_cluster(
            'start --backend slurm --workers 1 --time 10 --sbatch "--comment=from-the-magic --nice=0"'
        )
        (job,) = sess.cluster.launcher.job_ids
        shown = slurm.run("scontrol", "show", "job", "-o", job).stdout
        assert "Comment=from-the-magic" in shown and "TimeLimit=00:10:00" in shown, shown
        magics.tf_cluster("stop")
        poll_for(lambda: not slurm.queue(), 30, what="the magic's job to end")
    finally:
        if sess.cluster is not None and sess.cluster.running:
            sess.cluster.stop()
        sess.cluster = previous
