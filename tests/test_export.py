"""Exported Slurm scripts and Kubernetes manifests: well-formed, consistent, read back by TensorFlow.

No Slurm, no Kubernetes and no TensorFlow server here.  The Slurm script is
checked by bash, by parsing its #SBATCH and srun lines, and by running
TensorFlow's SlurmClusterResolver (inside the script's own launcher) in a
simulated allocation: the environment Slurm would give each rank.  The
manifests are parsed as YAML and every TF_CONFIG is read back by
TFConfigClusterResolver.  The launcher is tfmagic/export/launch.py, imported
here as a module; its text is what the exports carry.
"""

from __future__ import annotations

import ast
import doctest
import importlib
import json
import os
import re
import shlex
import socket
import stat
import subprocess
import sys

import pytest
import yaml

from tfmagic import cli, export
from tfmagic.errors import BadClusterShape, ExportError, TfmagicError
from tfmagic.export import (
    LAUNCHER,
    LAUNCHER_DIR,
    job_counts,
    kubernetes_manifests,
    kubernetes_tf_configs,
    launch,
    slurm_script,
    to_yaml,
    write_export,
)
from tfmagic.spec import ClusterDef, ClusterShape

pytestmark = pytest.mark.unit

DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")

SHAPES = [
    ClusterShape(ps=1, workers=2),
    ClusterShape(ps=2, workers=3, chief=1),
    ClusterShape(ps=0, workers=4),
]


@pytest.fixture(scope="module")
def tf():
    tensorflow = pytest.importorskip("tensorflow")
    return tensorflow


@pytest.fixture
def clean_env(monkeypatch):
    """Whatever the launcher or the resolvers set in os.environ is undone after the test."""
    for name in ("TF_CONFIG", "CUDA_VISIBLE_DEVICES", "TFMAGIC_DRY_RUN"):
        monkeypatch.setenv(name, "placeholder")
        monkeypatch.delenv(name)
    return monkeypatch


# --------------------------------------------------------------------------
# reading a Slurm script


def sbatch_options(script: str) -> dict[str, str]:
    out = {}
    for line in script.splitlines():
        if line.startswith("#SBATCH "):
            key, _, value = line[len("#SBATCH ") :].partition("=")
            out[key] = value
    return out


def srun_argv(script: str) -> list[str]:
    """The srun command line, continuation lines joined, as bash would split it."""
    lines = script.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("srun "))
    text = ""
    for line in lines[start:]:
        text += line.rstrip("\\").rstrip() + " "
        if not line.endswith("\\"):
            break
    return shlex.split(text)


def launcher_opts(script: str) -> dict[str, list[str]]:
    """The launcher's options on the srun line: {'--jobs': ['ps=1,worker=2'], '--role': [...], ...}"""
    argv = srun_argv(script)
    args = argv[argv.index("$TFMAGIC_LAUNCHER") + 1 : argv.index("--")]
    opts: dict[str, list[str]] = {}
    for key, value in zip(args[::2], args[1::2]):
        opts.setdefault(key, []).append(value)
    return opts


def expand_allocation(nodes: list[str], tasks: list[int]) -> list[tuple[str, int]]:
    """(node, local task number) of each rank, as srun --distribution=block hands them out."""
    return [(node, local) for node, n in zip(nodes, tasks) for local in range(n)]


def slurm_env(monkeypatch, nodelist, tasks_per_node, nodes, tasks, rank):
    """The variables SlurmClusterResolver reads (and the two the launcher checks placement with)."""
    node, local = expand_allocation(nodes, tasks)[rank]
    monkeypatch.setenv("SLURM_PROCID", str(rank))
    monkeypatch.setenv("SLURM_STEP_NODELIST", nodelist)
    monkeypatch.setenv("SLURM_STEP_TASKS_PER_NODE", tasks_per_node)
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", str(sum(tasks)))
    monkeypatch.setenv("SLURMD_NODENAME", node)
    monkeypatch.setenv("SLURM_LOCALID", str(local))


# --------------------------------------------------------------------------
# Slurm


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_sbatch_and_srun_lines_match_the_shape(shape):
    script = slurm_script(
        shape, program="train.py", port=9000, partition="cpu", time="02:30:00", job_name="mnist"
    )
    opts = sbatch_options(script)
    assert opts["--ntasks"] == str(shape.size)
    assert opts["--job-name"] == "mnist"
    assert opts["--time"] == "02:30:00"
    assert opts["--partition"] == "cpu"
    assert "--gres" not in opts and "--nodes" not in opts
    argv = srun_argv(script)
    assert argv[0] == "srun"
    assert f"--ntasks={shape.size}" in argv
    assert "--distribution=block" in argv and "--kill-on-bad-exit=1" in argv
    assert argv[argv.index("--") + 1 :] == ["train.py"]
    opts = launcher_opts(script)
    assert opts["--resolver"] == ["slurm"]
    assert opts["--port-base"] == ["9000"]
    jobs = dict(pair.split("=") for pair in opts["--jobs"][0].split(","))
    assert {job: int(n) for job, n in jobs.items()} == shape.counts()
    roles = dict(r.split("=") for r in opts["--role"])
    assert roles == {job: "serve" if job == "ps" else "serve+run" for job in shape.counts()}


def test_sbatch_directives_come_before_any_command():
    script = slurm_script(
        ClusterShape(ps=1, workers=2), setup=["module load tensorflow", "source venv/bin/activate"]
    )
    lines = script.splitlines()
    assert lines[0] == "#!/bin/bash"
    last_directive = max(i for i, line in enumerate(lines) if line.startswith("#SBATCH"))
    first_command = min(i for i, line in enumerate(lines) if line and not line.startswith("#"))
    assert last_directive < first_command
    assert lines.index("module load tensorflow") < lines.index("source venv/bin/activate") < len(lines)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_script_is_valid_bash_and_carries_the_launcher_verbatim(shape, tmp_path):
    script = slurm_script(shape, program="my train.py", program_args=["--lr", "0.1", "it's"])
    path = tmp_path / "job.sbatch"
    path.write_text(script)
    result = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    body = script.split("<<'TFMAGIC_LAUNCHER_EOF' || true\n", 1)[1].split("\nTFMAGIC_LAUNCHER_EOF\n", 1)[0]
    assert body == LAUNCHER.rstrip("\n")
    argv = srun_argv(script)
    assert argv[argv.index("--") + 1 :] == ["my train.py", "--lr", "0.1", "it's"]
    assert "scontrol" not in script


@pytest.mark.parametrize(
    "shape, nodelist, tasks_per_node, nodes, tasks",
    [
        (ClusterShape(ps=1, workers=2), "node[1-2]", "2,1", ["node1", "node2"], [2, 1]),
        (ClusterShape(ps=2, workers=3, chief=1), "n[01-03]", "2(x3)", ["n01", "n02", "n03"], [2, 2, 2]),
        (ClusterShape(ps=1, workers=3), "a1,b[7-8]", "1,2,1", ["a1", "b7", "b8"], [1, 2, 1]),
    ],
)
def test_resolver_reads_a_simulated_allocation(tf, clean_env, shape, nodelist, tasks_per_node, nodes, tasks):
    """Each rank, with the environment Slurm would give it, resolves to its own task of one shared cluster."""
    script = slurm_script(shape, port=8888)
    opts = launcher_opts(script)
    jobs = launch.parse_counts(opts["--jobs"][0])
    port_base = int(opts["--port-base"][0])
    assert jobs == shape.counts() and port_base == 8888

    placement = expand_allocation(nodes, tasks)
    expected_tasks = [(job, i) for job in sorted(jobs) for i in range(jobs[job])]  # rank order: jobs by name
    expected = {job: [] for job in jobs}
    for (job, _), (node, local) in zip(expected_tasks, placement):
        expected[job].append(f"{node}:{port_base + local}")

    seen = []
    for rank in range(shape.size):
        slurm_env(clean_env, nodelist, tasks_per_node, nodes, tasks, rank)
        cluster, job, index = launch.resolve_slurm(jobs, port_base)
        assert cluster == expected
        assert (job, index) == expected_tasks[rank]
        launch.configure(cluster, job, index)
        config = json.loads(os.environ["TF_CONFIG"])
        assert config == {"cluster": expected, "task": {"type": job, "index": index}}
        assert os.environ["CUDA_VISIBLE_DEVICES"] == ""  # no GPUs asked for: hidden from every task
        seen.append((job, index))
    assert sorted(seen) == sorted(expected_tasks)
    addresses = [a for addrs in expected.values() for a in addrs]
    assert len(set(addresses)) == len(addresses)


def test_gpus_are_shared_out_by_the_resolver_and_hidden_from_ps(tf, clean_env):
    shape = ClusterShape(ps=1, workers=3)
    script = slurm_script(shape, gpus_per_worker=1, tasks_per_node=2)
    opts = sbatch_options(script)
    assert (opts["--nodes"], opts["--ntasks-per-node"], opts["--gres"]) == ("2", "2", "gpu:2")
    argv = srun_argv(script)
    assert "--gres=gpu:2" in argv and "--ntasks-per-node=2" in argv
    opts = launcher_opts(script)
    gpus_per_task, gpus_per_node = int(opts["--gpus-per-task"][0]), int(opts["--gpus-per-node"][0])
    assert (gpus_per_task, gpus_per_node) == (1, 2)
    visible = []
    for rank in range(4):
        slurm_env(clean_env, "gpu[1-2]", "2(x2)", ["gpu1", "gpu2"], [2, 2], rank)
        cluster, job, index = launch.resolve_slurm(shape.counts(), 8888, gpus_per_task, gpus_per_node)
        launch.configure(cluster, job, index, gpus_per_task)
        visible.append((f"{job}:{index}", os.environ["CUDA_VISIBLE_DEVICES"]))
    assert visible == [("ps:0", ""), ("worker:0", "1"), ("worker:1", "0"), ("worker:2", "1")]


def test_launcher_stops_when_resolver_and_slurm_disagree_on_node_order(tf, clean_env):
    """The resolver sorts node names as text: node10 comes before node9, Slurm's rank 0 is on node9."""
    shape = ClusterShape(ps=1, workers=1)
    slurm_env(clean_env, "node[9-10]", "1(x2)", ["node9", "node10"], [1, 1], 0)
    with pytest.raises(SystemExit) as info:
        launch.resolve_slurm(shape.counts(), 8888)
    message = str(info.value)
    assert "node10:8888" in message and "node9" in message and "zero-padded" in message


def test_launcher_explains_a_changed_task_count(tf, clean_env):
    slurm_env(clean_env, "node[1-2]", "2(x2)", ["node1", "node2"], [2, 2], 0)
    with pytest.raises(SystemExit) as info:
        launch.resolve_slurm({"ps": 1, "worker": 2}, 8888)
    assert "Requested 3 tasks but only 4 were assigned" in str(info.value)
    assert "export it again" in str(info.value)


# --------------------------------------------------------------------------
# the launcher's own logic


def test_serving_tasks_wait_until_every_program_task_was_seen_and_is_gone():
    timeline = iter(
        [
            {"a"},  # a is up, b not yet
            set(),  # a finished before b ever came up: not done, b has not been seen
            {"b"},
            {"b"},
            set(),  # both seen, none up: done
            {"never": "reached"},
        ]
    )
    state = {"up": set(next(timeline)), "probes": 0}

    def probe(address):
        return address in state["up"]

    def sleep(_):
        state["probes"] += 1
        state["up"] = set(next(timeline))

    launch.wait_until_done(["a:1", "b:1"], 0.01, probe=lambda a: probe(a[0]), sleep=sleep)
    assert state["probes"] == 4


def test_port_probe_sees_a_listening_socket_come_and_go():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    address = "127.0.0.1:%d" % server.getsockname()[1]
    assert launch.port_open(address)
    server.close()
    assert not launch.port_open(address)
    assert not launch.port_open("no-such-host.invalid:2222")


@pytest.mark.parametrize(
    "strategy, shape, expected",
    [
        ("between-graph", ClusterShape(ps=1, workers=2), {"ps": "serve", "worker": "serve+run"}),
        (
            "parameter-server",
            ClusterShape(ps=2, workers=2, chief=1),
            {"chief": "run", "ps": "serve", "worker": "serve"},
        ),
        ("collective", ClusterShape(ps=0, workers=3), {"worker": "run"}),
        ("custom", ClusterShape(ps=1, workers=1), {"ps": "run", "worker": "run"}),
    ],
)
def test_roles_per_strategy_and_what_serving_tasks_wait_for(strategy, shape, expected):
    assert export.roles(shape.counts(), strategy) == expected
    cluster = {job: [f"{job}{i}:1" for i in range(n)] for job, n in shape.counts().items()}
    waited = launch.program_addresses(cluster, expected)
    assert waited == [a for job in sorted(cluster) if "run" in expected[job] for a in cluster[job]]
    roles = launcher_opts(slurm_script(shape, strategy=strategy))["--role"]
    assert dict(r.split("=") for r in roles) == expected


def test_program_runs_as_main_with_its_arguments_and_exit_code(tmp_path, monkeypatch):
    program = tmp_path / "train.py"
    program.write_text(
        "import sys\n"
        "if __name__ == '__main__':\n"
        "    open(sys.argv[1], 'w').write(repr((sys.argv[2:], server)))\n"
        "    sys.exit(int(sys.argv[2]))\n"
    )
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    out = tmp_path / "out.txt"
    assert launch.run_program([str(program), str(out), "3"], "SERVER") == 3
    assert out.read_text() == "(['3'], 'SERVER')"
    assert launch.run_program([str(program), str(out), "0"], None) == 0
    crash = tmp_path / "crash.py"
    crash.write_text("raise ValueError('boom')\n")
    assert launch.run_program([str(crash)], None) == 1


def test_launcher_main_dry_run_from_tf_config(tf, clean_env, capsys):
    configs = kubernetes_tf_configs(ClusterShape(ps=1, workers=2))
    clean_env.setenv("TF_CONFIG", json.dumps(configs["worker:1"]))
    clean_env.setenv("TFMAGIC_DRY_RUN", "1")
    argv = ["--resolver", "tf_config", "--role", "ps=serve", "--role", "worker=serve+run", "--", "train.py"]
    assert launch.main(argv) == 0
    out = capsys.readouterr().out
    assert "worker:1 at tfmagic-worker-1:2222, role serve+run" in out
    assert json.loads(os.environ["TF_CONFIG"]) == configs["worker:1"]
    with pytest.raises(SystemExit, match="after '--'"):
        launch.main(["--resolver", "tf_config"])
    with pytest.raises(SystemExit, match="no --role for job 'worker'"):
        launch.main(["--resolver", "tf_config", "--role", "ps=serve", "--", "train.py"])
    clean_env.delenv("TF_CONFIG")
    with pytest.raises(SystemExit, match="TF_CONFIG is missing"):
        launch.main(["--resolver", "tf_config", "--role", "ps=serve", "--", "train.py"])


def test_launcher_runs_with_python_dash_c_and_has_usage():
    result = subprocess.run([sys.executable, "-c", LAUNCHER, "--help", "--"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "--resolver" in result.stdout and "Start one TensorFlow task" in result.stdout


def test_the_exports_carry_the_launcher_module_file():
    """LAUNCHER is the text of tfmagic/export/launch.py, the module these tests import."""
    with open(launch.__file__, encoding="utf-8") as file:
        source = file.read()
    assert source == LAUNCHER and LAUNCHER.endswith("\n")
    assert "TFMAGIC_LAUNCHER_EOF" not in LAUNCHER.splitlines()  # would end the script's here-document early
    assert LAUNCHER.isascii() and "\t" not in LAUNCHER


def test_launcher_imports_only_the_standard_library_and_tensorflow():
    """It runs where tfmagic is not installed: no tfmagic import, nothing else from PyPI."""
    tree = ast.parse(LAUNCHER)
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "a relative import would need the tfmagic package"
            imported.add(node.module.split(".")[0])
    assert "tensorflow" in imported
    assert imported - {"tensorflow"} <= sys.stdlib_module_names, imported - sys.stdlib_module_names


def test_launcher_runs_as_a_lone_file_without_site_packages(tmp_path):
    """As in a Pod: launch.py alone in a directory, no tfmagic importable; its usage needs no TensorFlow."""
    lone = tmp_path / "launch.py"
    lone.write_text(LAUNCHER)
    result = subprocess.run(
        [sys.executable, "-I", "-S", str(lone), "--help", "--"], capture_output=True, text=True, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert "--resolver" in result.stdout and "Start one TensorFlow task" in result.stdout
    missing = subprocess.run(
        [sys.executable, "-I", "-S", str(lone), "--resolver", "tf_config"], capture_output=True, text=True
    )
    assert missing.returncode == 1 and "put the program after '--'" in missing.stderr


def test_parse_counts():
    assert launch.parse_counts("ps=1,worker=2") == {"ps": 1, "worker": 2}
    assert launch.parse_counts("chief=1, ps=2 ,worker=3") == {"chief": 1, "ps": 2, "worker": 3}


# --------------------------------------------------------------------------
# Kubernetes


def parse(text: str) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(text) if doc is not None]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("namespace", [None, "ml-team"])
def test_pods_and_services_agree_and_tf_reads_each_tf_config(tf, clean_env, shape, namespace):
    text = kubernetes_manifests(
        shape,
        image="registry.example.com/me/train:1",
        program="/app/train.py",
        port=2345,
        namespace=namespace,
        name="mnist",
        program_args=["--epochs", "3"],
    )
    docs = parse(text)
    kinds = [d["kind"] for d in docs]
    assert kinds == ["ConfigMap"] + ["Service"] * shape.size + ["Pod"] * shape.size
    assert all(d["apiVersion"] == "v1" for d in docs)
    config_map, services, pods = docs[0], docs[1 : 1 + shape.size], docs[1 + shape.size :]
    assert config_map["metadata"]["name"] == "mnist-launcher"
    assert config_map["data"]["launch.py"] == LAUNCHER
    for doc in docs:
        assert doc["metadata"].get("namespace") == namespace
        for key, value in doc["metadata"].get("labels", {}).items():
            assert isinstance(value, str) and LABEL_VALUE.match(value) and len(value) <= 63, (key, value)

    suffix = f".{namespace}.svc" if namespace else ""
    expected_cluster = {
        job: [f"mnist-{job}-{i}{suffix}:2345" for i in range(n)] for job, n in shape.counts().items()
    }
    by_name = {}
    for svc in services:
        name = svc["metadata"]["name"]
        assert DNS1035.match(name) and len(name) <= 63
        spec = svc["spec"]
        assert spec["clusterIP"] == "None"  # headless: the name resolves to the Pod itself
        assert spec["ports"] == [{"name": "tf", "port": 2345, "targetPort": 2345, "protocol": "TCP"}]
        matching = [p for p in pods if spec["selector"].items() <= p["metadata"]["labels"].items()]
        assert [p["metadata"]["name"] for p in matching] == [name]
        by_name[name] = svc
    assert sorted(by_name) == sorted(
        a.split(".")[0].split(":")[0] for a in sum(expected_cluster.values(), [])
    )

    for pod in pods:
        name = pod["metadata"]["name"]
        assert DNS1123.match(name) and name in by_name
        labels = pod["metadata"]["labels"]
        job, index = labels["tfmagic/job"], int(labels["tfmagic/task"].rsplit("-", 1)[1])
        assert name == f"mnist-{job}-{index}"
        spec = pod["spec"]
        assert spec["restartPolicy"] == "Never"
        (container,) = spec["containers"]
        assert container["image"] == "registry.example.com/me/train:1"
        assert container["ports"][0]["containerPort"] == 2345
        env = {e["name"]: e["value"] for e in container["env"]}
        assert all(isinstance(v, str) for v in env.values())
        assert env["CUDA_VISIBLE_DEVICES"] == ""  # no GPUs asked for: every task CPU-only
        command = container["command"]
        assert command[:4] == ["python3", f"{LAUNCHER_DIR}/launch.py", "--resolver", "tf_config"]
        assert command[command.index("--") + 1 :] == ["/app/train.py", "--epochs", "3"]
        assert container["volumeMounts"][0]["mountPath"] == LAUNCHER_DIR
        assert spec["volumes"][0]["configMap"]["name"] == "mnist-launcher"

        config = json.loads(env["TF_CONFIG"])
        assert config == {"cluster": expected_cluster, "task": {"type": job, "index": index}}
        clean_env.setenv("TF_CONFIG", env["TF_CONFIG"])
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        assert resolver.cluster_spec().as_dict() == expected_cluster
        assert (resolver.task_type, resolver.task_id) == (job, index)
        assert launch.resolve_tf_config() == (expected_cluster, job, index)
        address = expected_cluster[job][index]
        assert address.split(".")[0].split(":")[0] == name and address.endswith(":2345")


def test_gpu_pods_ask_for_gpus_and_ps_pods_do_not():
    docs = parse(kubernetes_manifests(ClusterShape(ps=1, workers=2), image="img:1", gpus_per_worker=2))
    for pod in (d for d in docs if d["kind"] == "Pod"):
        (container,) = pod["spec"]["containers"]
        env = {e["name"]: e["value"] for e in container["env"]}
        if pod["metadata"]["labels"]["tfmagic/job"] == "ps":
            assert env["CUDA_VISIBLE_DEVICES"] == "" and "resources" not in container
        else:
            assert "CUDA_VISIBLE_DEVICES" not in env
            assert container["resources"] == {"limits": {"nvidia.com/gpu": 2}}


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_tfjob_is_what_the_training_operator_accepts(tf, clean_env, shape):
    text = kubernetes_manifests(shape, image="img:1", tfjob=True, name="mnist", namespace="ml", port=2300)
    docs = parse(text)
    assert [d["kind"] for d in docs] == ["ConfigMap", "TFJob"]
    job = docs[1]
    assert job["apiVersion"] == "kubeflow.org/v1"
    assert DNS1035.match(job["metadata"]["name"])  # the operator's ValidateV1TFJob
    replicas = job["spec"]["tfReplicaSpecs"]
    names = {"chief": "Chief", "ps": "PS", "worker": "Worker"}
    assert {rtype: r["replicas"] for rtype, r in replicas.items()} == {
        names[j]: n for j, n in shape.counts().items()
    }
    assert sum(rtype in ("Chief", "Master") for rtype in replicas) <= 1
    for rtype, replica in replicas.items():
        containers = replica["template"]["spec"]["containers"]
        tensorflow = [c for c in containers if c["name"] == "tensorflow"]  # the operator looks for this name
        assert len(tensorflow) == 1 and all(c["image"] for c in containers)
        assert {"name": "tfjob-port", "containerPort": 2300, "protocol": "TCP"} in tensorflow[0]["ports"]
        env = {e["name"]: e["value"] for e in tensorflow[0]["env"]}
        assert "TF_CONFIG" not in env  # the operator sets it
        if rtype == "PS":
            assert env["CUDA_VISIBLE_DEVICES"] == ""
    assert job["spec"].get("successPolicy") == (None if shape.chief else "AllWorkers")

    # What the operator will set, as its genClusterSpec reads; TensorFlow must read it back.
    configs = kubernetes_tf_configs(shape, tfjob=True, name="mnist", namespace="ml", port=2300)
    for task, config in configs.items():
        assert config["cluster"]["worker"][0] == "mnist-worker-0.ml.svc:2300"
        clean_env.setenv("TF_CONFIG", json.dumps(config))
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        assert f"{resolver.task_type}:{resolver.task_id}" == task
        assert resolver.cluster_spec().as_dict() == config["cluster"]


@pytest.mark.parametrize(
    "value",
    [
        "0",
        "2222",
        "yes",
        "No",
        "on",
        "null",
        "~",
        "",
        "a: b",
        "it's",
        '{"a": [1]}',
        "1:20",
        "x\ny",
        "tab\t",
        "-",
        "--resolver",
        "#c",
        "é",
        "ps=serve",
        "/etc/tfmagic",
        " lead",
        "trail ",
        "*star",
        "&amp",
        "!tag",
    ],
)
def test_yaml_writer_round_trips_awkward_strings(value):
    assert yaml.safe_load(to_yaml({"k": value, "l": [value, {"m": value}]})) == {
        "k": value,
        "l": [value, {"m": value}],
    }


@pytest.mark.parametrize("value", ["y", "Y", "n", "N", "0o17", "0x1F", "1_000", "0b101", "=", "<<", "None"])
def test_yaml_writer_quotes_what_go_yaml_reads_as_a_boolean_or_number(value):
    """Kubernetes parses manifests with Go's YAML 1.1 library, where plain y is true and 0o17 is 15."""
    text = to_yaml({"k": value})
    assert text in (f"k: '{value}'\n", f'k: "{value}"\n')
    assert yaml.safe_load(text) == {"k": value}


def test_yaml_writer_keeps_the_launcher_readable_as_a_literal_block():
    text = kubernetes_manifests(ClusterShape(), image="i:1")
    assert '\n  launch.py: |\n    """Start one TensorFlow task' in text
    body = text.split("  launch.py: |\n", 1)[1].split("\n---\n", 1)[0]
    assert [line[4:] if line else "" for line in body.split("\n")] == LAUNCHER.rstrip("\n").split("\n")


def test_yaml_writer_never_folds_long_lines():
    value = "x " * 300
    assert to_yaml({"k": value}).count("\n") == 1


def test_yaml_writer_keeps_numbers_booleans_and_empties():
    data = {"n": 3, "t": True, "f": False, "z": None, "e": {}, "el": [], "nested": [[1, 2], {"a": []}]}
    assert yaml.safe_load(to_yaml(data)) == data


# --------------------------------------------------------------------------
# input, errors, files and the command line


def test_a_clusterdef_exports_like_its_shape():
    defn = ClusterDef.from_mapping({"worker": ["127.0.0.1:2", "127.0.0.1:3"], "ps": ["127.0.0.1:1"]})
    shape = ClusterShape(ps=1, workers=2)
    assert slurm_script(defn) == slurm_script(shape) == slurm_script({"ps": 1, "worker": 2})
    assert kubernetes_manifests(defn, image="i:1") == kubernetes_manifests(shape, image="i:1")
    assert job_counts({"worker": 1, "chief": 1, "ps": 0}) == {"chief": 1, "worker": 1}


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: slurm_script("ps=1"), "ClusterShape"),
        (lambda: slurm_script({"evaluator": 1, "worker": 1}), "'evaluator'"),
        (lambda: slurm_script(ClusterShape(ps=1, workers=2), strategy="collective"), "ps=0"),
        (lambda: slurm_script(ClusterShape(ps=1, workers=2), strategy="parameter-server"), "chief"),
        (lambda: slurm_script(ClusterShape(), strategy="allreduce"), "between-graph"),
        (lambda: slurm_script(ClusterShape(), port=65535), "65535"),
        (lambda: slurm_script(ClusterShape(), port="2222"), "port"),
        (lambda: slurm_script(ClusterShape(), time="1 hour"), "HH:MM:SS"),
        (lambda: slurm_script(ClusterShape(), partition="gpu; rm -rf"), "partition"),
        (lambda: slurm_script(ClusterShape(), gpus_per_worker=1), "tasks_per_node"),
        (lambda: slurm_script(ClusterShape(), program="a\nb"), "one line"),
        (lambda: slurm_script(ClusterShape(), program_args="--lr 1"), "list"),
        (lambda: kubernetes_manifests(ClusterShape(), image=""), "image"),
        (lambda: kubernetes_manifests(ClusterShape(), image="i:1", name="My_Job"), "lower-case"),
        (lambda: kubernetes_manifests(ClusterShape(), image="i:1", name="x" * 60), "63"),
        (lambda: kubernetes_manifests(ClusterShape(), image="i:1", namespace="Team A"), "namespace"),
        (lambda: kubernetes_manifests(ClusterShape(), image="i:1", gpus_per_worker=-1), "gpus_per_worker"),
        (lambda: export.export("nomad", ClusterShape()), "slurm, kubernetes, tfjob"),
    ],
)
def test_bad_input_says_what_was_wrong(call, match):
    with pytest.raises(ExportError, match=match) as info:
        call()
    assert isinstance(info.value, TfmagicError) and isinstance(info.value, ValueError)


def test_impossible_shapes_are_the_spec_errors():
    with pytest.raises(BadClusterShape, match="workers"):
        slurm_script({"ps": 1})


def test_write_export_writes_each_kind(tmp_path):
    shape = ClusterShape(ps=1, workers=2)
    sbatch = write_export("slurm", tmp_path / "job.sbatch", shape)
    assert sbatch.read_text() == slurm_script(shape) and sbatch.stat().st_mode & stat.S_IXUSR
    pods = write_export("kubernetes", tmp_path / "pods.yaml", shape, image="i:1")
    assert pods.read_text() == kubernetes_manifests(shape, image="i:1")
    job = write_export("tfjob", tmp_path / "tfjob.yaml", shape, image="i:1")
    assert [d["kind"] for d in parse(job.read_text())] == ["ConfigMap", "TFJob"]


def test_write_export_refuses_an_existing_file_unless_forced_and_keeps_its_mode(tmp_path):
    shape = ClusterShape(ps=1, workers=2)
    path = tmp_path / "job.sbatch"
    path.write_text("#!/bin/bash\n# edited by hand\n")
    path.chmod(0o640)
    with pytest.raises(ExportError, match="exists already; pass --force") as info:
        write_export("slurm", path, shape)
    assert "\n" not in str(info.value) and "another path" in str(info.value)
    assert path.read_text() == "#!/bin/bash\n# edited by hand\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert write_export("slurm", path, shape, force=True) == path
    assert path.read_text() == slurm_script(shape)
    assert stat.S_IMODE(path.stat().st_mode) == 0o640  # not made executable: the mode is the owner's
    longer = slurm_script(ClusterShape(ps=2, workers=3, chief=1))
    write_export("slurm", path, ClusterShape(ps=2, workers=3, chief=1), force=True)
    write_export("slurm", path, shape, force=True)  # shorter than what it replaces: no tail left
    assert path.read_text() == slurm_script(shape) and len(longer) > len(slurm_script(shape))


def test_new_files_get_their_mode_from_the_umask(tmp_path):
    shape = ClusterShape(ps=1, workers=2)
    old = os.umask(0o027)
    try:
        sbatch = write_export("slurm", tmp_path / "job.sbatch", shape)
        pods = write_export("kubernetes", tmp_path / "pods.yaml", shape, image="i:1")
    finally:
        os.umask(old)
    assert stat.S_IMODE(sbatch.stat().st_mode) == 0o750
    assert stat.S_IMODE(pods.stat().st_mode) == 0o640


def test_bad_options_leave_no_file(tmp_path):
    path = tmp_path / "job.sbatch"
    with pytest.raises(ExportError, match="not a Slurm time limit"):
        write_export("slurm", path, ClusterShape(), time="soon")
    assert not os.path.lexists(path)


def a_file(tmp_path):
    path = tmp_path / "file"
    path.write_text("not a directory\n")
    return path


@pytest.mark.parametrize(
    "where, force, match",
    [
        (lambda tmp: tmp, False, "is a directory; give a file name in it, e.g. "),
        (lambda tmp: tmp, True, "is a directory; give a file name in it, e.g. "),
        (lambda tmp: tmp / "missing" / "job.sbatch", False, "does not exist; create it first (mkdir -p "),
        (lambda tmp: a_file(tmp) / "job.sbatch", False, "file is a file, not a directory"),
        (lambda tmp: a_file(tmp) / "sub" / "job.sbatch", True, "file is a file, not a directory"),
        (lambda tmp: tmp / "dangling", False, "exists already; pass --force"),
    ],
    ids=["directory", "directory-force", "no-parent", "under-a-file", "deep-under-a-file", "dangling-link"],
)
def test_unwritable_places_are_one_line_saying_what_to_do(tmp_path, where, force, match):
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    path = where(tmp_path)
    with pytest.raises(ExportError) as info:
        write_export("slurm", path, ClusterShape(), force=force)
    message = str(info.value)
    assert match in message and "\n" not in message and str(path) in message
    assert not os.path.lexists(tmp_path / "nowhere") and not os.path.lexists(tmp_path / "missing")


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (a device whose writes fail)")
def test_a_write_that_fails_half_way_is_one_line():
    with pytest.raises(ExportError, match="exists already"):
        write_export("slurm", "/dev/full", ClusterShape())
    with pytest.raises(ExportError) as info:
        write_export("slurm", "/dev/full", ClusterShape(), force=True)
    message = str(info.value)
    assert "writing /dev/full failed: No space left on device" in message and "\n" not in message
    assert message.endswith("free some space or choose another path")
    assert os.path.exists("/dev/full")  # an existing file is never removed


def test_a_new_file_whose_write_fails_is_removed(tmp_path, monkeypatch):
    real_fdopen = os.fdopen

    class FillsUp:
        """A file that takes a few bytes, then reports a full disk."""

        def __init__(self, fd, *args, **kwargs):
            self.file = real_fdopen(fd, *args, **kwargs)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.file.close()

        def write(self, text):
            self.file.write(text[:10])
            self.file.flush()
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fdopen", FillsUp)
    path = tmp_path / "job.sbatch"
    with pytest.raises(ExportError, match=r"No space left on device \(removed what was written\)") as info:
        write_export("slurm", path, ClusterShape())
    assert "\n" not in str(info.value) and not os.path.lexists(path)


@pytest.mark.parametrize(
    "path, reasons",
    [
        (
            "/sys/tfmagic-test.sbatch",
            ("permission denied (the file or its directory", "Read-only file system"),
        ),
        ("/proc/tfmagic-test.sbatch", ("/proc takes no new files",)),
    ],
)
def test_places_nobody_can_write_to_not_even_root(path, reasons):
    if not os.path.isdir(os.path.dirname(path)) or os.path.lexists(path):
        pytest.skip(f"needs {os.path.dirname(path)} mounted as usual")
    with pytest.raises(ExportError) as info:
        write_export("slurm", path, ClusterShape())
    message = str(info.value)
    assert message.startswith(f"cannot write {path}: ") and "\n" not in message
    assert any(reason in message for reason in reasons), message


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_a_directory_without_write_permission(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        with pytest.raises(
            ExportError,
            match="permission denied .the file or its directory is not yours to write.; choose another",
        ):
            write_export("slurm", locked / "job.sbatch", ClusterShape())
    finally:
        locked.chmod(0o700)


def tfmagic_export(*argv: str) -> subprocess.CompletedProcess:
    """``tfmagic export ARGV`` in a fresh process, as a shell would run it."""
    return subprocess.run(
        [sys.executable, "-m", "tfmagic.cli", "export", *argv], capture_output=True, text=True, timeout=120
    )


def test_command_line_writes_to_stdout_or_a_file(capsys, tmp_path):
    assert (
        cli.main(
            ["export", "slurm", "--ps", "1", "--workers", "3", "--partition", "cpu", "--", "--lr", "0.1"]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert out == slurm_script(ClusterShape(ps=1, workers=3), partition="cpu", program_args=["--lr", "0.1"])
    target = tmp_path / "k.yaml"
    assert cli.main(["export", "tfjob", "--image", "i:1", "--namespace", "ml", "-o", str(target)]) == 0
    assert target.read_text() == kubernetes_manifests(ClusterShape(), image="i:1", tfjob=True, namespace="ml")


def test_command_line_kinds_and_their_old_spellings(capsys, tmp_path):
    outputs = {}
    for argv in (
        ["k8s", "--image", "i:1"],
        ["kubernetes", "--image", "i:1"],
        ["tfjob", "--image", "i:1"],
        ["k8s", "--image", "i:1", "--tfjob"],
        ["kubernetes", "--image", "i:1", "--tfjob"],
    ):
        assert cli.main(["export", *argv]) == 0
        outputs[" ".join(argv)] = capsys.readouterr().out
    pods, tfjob = (
        kubernetes_manifests(ClusterShape(), image="i:1"),
        export.export("tfjob", ClusterShape(), image="i:1"),
    )
    assert outputs["k8s --image i:1"] == outputs["kubernetes --image i:1"] == pods
    assert outputs["tfjob --image i:1"] == outputs["k8s --image i:1 --tfjob"] == tfjob
    assert outputs["kubernetes --image i:1 --tfjob"] == tfjob


def test_command_line_refuses_to_replace_a_file_unless_forced(capsys, tmp_path):
    target = tmp_path / "job.sbatch"
    target.write_text("mine\n")
    with pytest.raises(SystemExit) as info:
        cli.main(["export", "slurm", "--out", str(target)])
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.count("\n") == 1 and err.startswith("tfmagic export: ")
    assert f"{target} exists already; pass --force" in err and target.read_text() == "mine\n"
    assert cli.main(["export", "slurm", "--out", str(target), "--force"]) == 0
    assert target.read_text() == slurm_script(ClusterShape())
    with pytest.raises(SystemExit) as info:
        cli.main(["export", "slurm", "--force"])
    assert info.value.code == 2 and "--force replaces the file given with -o/--out" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, match",
    [
        (["slurm", "--workers", "0"], "workers=0 is too small"),
        (["slurm", "--time", "soon"], "not a Slurm time limit"),
        (["slurm", "--ps", "two"], "invalid int value"),
        (["k8s"], "--image"),
        (["k8s", "--image", "i:1", "--name", "Bad_Name"], "cannot name Kubernetes objects"),
        (["mesos"], "invalid choice"),
    ],
)
def test_command_line_errors_are_one_line_and_exit_2(capsys, argv, match):
    with pytest.raises(SystemExit) as info:
        cli.main(["export", *argv])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and match in err and err.startswith("tfmagic export")


def test_tfmagic_export_command():
    ok = tfmagic_export("slurm", "--ps", "1", "--workers", "2")
    assert ok.returncode == 0 and ok.stdout.startswith("#!/bin/bash\n") and not ok.stderr
    bad = tfmagic_export("slurm", "--chief", "2")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "at most one chief" in bad.stderr


def test_tfmagic_export_to_a_bad_place_is_one_line_without_traceback(tmp_path):
    for target, match in (
        (tmp_path, "is a directory"),
        (tmp_path / "missing" / "job.sbatch", "does not exist"),
        (a_file(tmp_path) / "job.sbatch", "is a file, not a directory"),
    ):
        bad = tfmagic_export("slurm", "-o", str(target))
        assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
        assert bad.stderr.startswith("tfmagic export: ") and match in bad.stderr and not bad.stdout


def test_python_dash_m_tfmagic_export_is_the_same_command_line():
    old = subprocess.run(
        [sys.executable, "-m", "tfmagic.export", "slurm", "--ps", "1", "--workers", "2"],
        capture_output=True,
        text=True,
    )
    assert old.returncode == 0 and old.stdout == tfmagic_export("slurm", "--ps", "1", "--workers", "2").stdout
    bad = subprocess.run(
        [sys.executable, "-m", "tfmagic.export", "slurm", "--chief", "2"], capture_output=True, text=True
    )
    assert bad.returncode == 2 and bad.stderr.startswith("tfmagic export: ") and bad.stderr.count("\n") == 1


def test_tfmagic_help_lists_export():
    result = subprocess.run([sys.executable, "-m", "tfmagic.cli", "--help"], capture_output=True, text=True)
    assert result.returncode == 0 and "export" in result.stdout and "demo" in result.stdout


def test_docstring_examples():
    failures = tried = 0
    for module in (export, *(importlib.import_module(f"tfmagic.export.{name}") for name in SUBMODULES)):
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        failures, tried = failures + result.failed, tried + result.attempted
    assert tried >= 5 and failures == 0


SUBMODULES = ("shape", "checks", "source", "slurm", "kubernetes", "yamldump", "render", "files", "cli")
