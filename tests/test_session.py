"""The session (what lives between cells, for scripts too), and three bugs the architecture review found."""

from __future__ import annotations

import pytest

import tfmagic
from tfmagic.session import ClusterRequest, Session

from .conftest import poll_for
from .kernelutil import Kernel

pytestmark = [pytest.mark.cluster, pytest.mark.usefixtures("no_leaks")]


def test_a_script_gets_the_magics_policy_reuse_refuse_replace():
    session = Session()
    try:
        cluster, outcome = session.start(ClusterRequest(ps=0, workers=1, spares=False))
        assert outcome.kind == "launched" and cluster.running
        again, outcome = session.start(ClusterRequest(ps=0, workers=1, spares=False))
        assert again is cluster and outcome.kind == "reused"
        with pytest.raises(tfmagic.ClusterRunning, match=r"another shape is running.*replace=True"):
            session.start(ClusterRequest(ps=0, workers=2, spares=False))
        assert cluster.running
        bigger, outcome = session.start(ClusterRequest(ps=0, workers=2, spares=False), replace=True)
        assert outcome.kind == "replaced" and "1 worker" in outcome.replaced
        assert not cluster.running and bigger.running and session.cluster is bigger
    finally:
        session.stop()


@pytest.mark.parametrize(
    "request_, why",
    [
        (ClusterRequest(ps=0, workers=1, backend="spark", master="bogus"), "is not a Spark master"),
        (
            ClusterRequest(
                ps=0, workers=1, backend="ssh", hosts=("node1",), ssh_config="/nonexistent/ssh_config"
            ),
            "ssh",
        ),
        (
            ClusterRequest(ps=0, workers=1, backend="ssh", hosts=("no-such-host.invalid",)),
            r"'no-such-host.invalid' \(no-such-host.invalid\) does not resolve here",
        ),
        (ClusterRequest(ps=0, workers=1, backend="nfs"), "unknown backend 'nfs'"),
        (ClusterRequest(ps=0, workers=1, collective=True, hosts=("a",)), "for the ssh backend"),
    ],
    ids=["spark-master", "ssh-config", "ssh-host", "backend", "foreign-option"],
)
def test_replace_checks_the_new_cluster_before_it_stops_the_running_one(request_, why):
    """A --replace that cannot build used to stop the running cluster first and leave the user with nothing."""
    session = Session()
    try:
        cluster, _ = session.start(ClusterRequest(ps=0, workers=1, spares=False))
        pids = [p.pid for p in cluster.procs.values()]
        with pytest.raises(tfmagic.TfmagicError, match=why):
            session.start(request_, replace=True)
        assert session.cluster is cluster and cluster.running
        assert [p.pid for p in cluster.procs.values()] == pids
    finally:
        session.stop()


def test_a_dashboard_on_an_attached_cluster_draws_its_table_and_plots(local_cluster):
    """AttachedLauncher.stats(proc) lacked `memory`: the refresh thread swallowed the TypeError."""
    from tfmagic.dashboard import Dashboard

    attached = tfmagic.attach(local_cluster.cluster_def.as_dict())
    try:
        run = tfmagic.train(attached, "async", model="linear", steps=60, block=False)
        dash = Dashboard(attached, runs=[run], refresh=0.1)
        dash.widget  # noqa: B018 - builds the widgets, as show() does
        dash.start()
        run.wait()
        dash.wait(20)
        table = dash.table_html()
        assert "worker:1" in table and "holding variables" in table, table
        assert dash.frames >= 2 and "60 updates" in dash.header_html()
    finally:
        attached.stop()


@pytest.mark.kernel
def test_a_finished_tf_train_leaves_nothing_subscribed():
    """Every %tf_train left its dashboard subscribed to the cluster and the run for the session's life."""
    k = Kernel(env={"TFMAGIC_SPARES": "0"})
    try:
        k.ok("%load_ext tfmagic\nimport tfmagic", timeout=60)
        k.ok("%tf_cluster start --ps 1 --workers 1", timeout=180)
        base = k.value("tfmagic.current_cluster().events.subscribers")
        for _ in range(3):
            k.ok("run = %tf_train --mode async --steps 40 --wait", timeout=120)
            # the dashboard ends with the run (it stayed subscribed for the session's life); 15 s, not
            # 4: in the niced lane of a clean-clone run its last frame took longer than 4 s to draw
            k.ok("run.dashboard.wait(15)")
            assert k.value("run.dashboard.refreshing") is False
        poll_for(
            lambda: k.value("tfmagic.current_cluster().events.subscribers") == base,
            20,
            what="the dashboards to let go of the cluster",
        )
        assert k.value("run.history.feed.subscribers") == 0
        assert k.value("run.dashboard.refreshing") is False
        k.ok("%tf_cluster stop")
    finally:
        pids = k.value("[p.pid for p in __import__('tfmagic.procs.owner', fromlist=['owner']).processes()]")
        k.shutdown()
        from .conftest import assert_gone

        assert_gone(pids)
