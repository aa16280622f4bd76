"""Kubernetes manifests: a headless Service and a Pod per task, or one Kubeflow TFJob.

A TensorFlow task has a fixed identity (its job, index and address in
``TF_CONFIG``), which Kubernetes' usual replicated workloads do not give, so
each task gets its own Pod and a headless Service whose DNS name is its
address.  Where the Kubeflow training operator is installed, a TFJob hands
that bookkeeping to the operator instead.  Either way every container runs the
same launcher as on Slurm, mounted from a ConfigMap.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence

from ..errors import ExportError
from .checks import check_args, check_count, check_port, one_line
from .shape import ClusterLike, describe, job_counts, role_args
from .source import LAUNCHER_FILE, launcher_source
from .yamldump import to_yaml

#: Where the Kubernetes Pods mount the launcher (from a ConfigMap).
LAUNCHER_DIR = "/etc/tfmagic"

_TFJOB_REPLICA = {"chief": "Chief", "ps": "PS", "worker": "Worker"}
_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_IMAGE = re.compile(r"^[^\s'\"]+$")


def _check_names(counts: Mapping[str, int], name: str, namespace: str | None) -> None:
    if not isinstance(name, str) or not _DNS1035.match(name):
        raise ExportError(
            f"name {name!r} cannot name Kubernetes objects: use lower-case letters, digits and '-', "
            "starting with a letter (for example 'mnist-ps')"
        )
    if namespace is not None and (
        not isinstance(namespace, str) or not _DNS1123.match(namespace) or len(namespace) > 63
    ):
        raise ExportError(
            f"namespace {namespace!r} is not a Kubernetes namespace name: lower-case letters, digits "
            "and '-', at most 63 characters"
        )
    longest = max((f"{name}-{job}-{n - 1}" for job, n in counts.items()), key=len)
    if len(longest) > 63:
        raise ExportError(
            f"the Service name {longest!r} would be {len(longest)} characters; Kubernetes allows 63. "
            "Use a shorter name"
        )


def task_dns_name(name: str, job: str, index: int) -> str:
    """The Service (and Pod) name of a task: ``<name>-<job>-<index>``, as the TFJob operator names them too."""
    return f"{name}-{job}-{index}"


def kubernetes_tf_configs(
    cluster: ClusterLike,
    *,
    name: str = "tfmagic",
    port: int = 2222,
    namespace: str | None = None,
    tfjob: bool = False,
) -> dict[str, dict]:
    """Each task's ``TF_CONFIG`` on Kubernetes, keyed by task (``"worker:1"``).

    For plain Pods this is what :func:`kubernetes_manifests` writes.  With
    ``tfjob=True`` it is what the Kubeflow training operator will set, as its
    source reads (``<name>-<job>-<i>.<namespace>.svc:<port>``, ``default``
    when no namespace is given); tfmagic cannot ask a real operator.

    >>> kubernetes_tf_configs({"ps": 1, "worker": 1})["worker:0"]["cluster"]
    {'ps': ['tfmagic-ps-0:2222'], 'worker': ['tfmagic-worker-0:2222']}
    """
    counts = job_counts(cluster)
    _check_names(counts, name, namespace)
    check_port(port)
    # The operator always writes the namespace; our own Pods can rely on the
    # DNS search path when the manifests do not name one.
    suffix = f".{namespace or 'default'}.svc" if tfjob or namespace else ""
    spec = {
        job: [f"{task_dns_name(name, job, i)}{suffix}:{port}" for i in range(n)] for job, n in counts.items()
    }
    out = {}
    for job, n in counts.items():
        for i in range(n):
            config = {"cluster": spec, "task": {"type": job, "index": i}}
            if tfjob:
                config["environment"] = "cloud"
            out[f"{job}:{i}"] = config
    return out


def _container(
    *, image, python, program, program_args, role_args, port, port_name, job, gpus_per_worker, env
) -> dict:
    command = [python, f"{LAUNCHER_DIR}/{LAUNCHER_FILE}", "--resolver", "tf_config"]
    if gpus_per_worker and job != "ps":
        command += ["--gpus-per-task", str(gpus_per_worker)]
    command += [*role_args, "--", program, *program_args]
    env = list(env) + [{"name": "PYTHONUNBUFFERED", "value": "1"}]
    if job == "ps" or not gpus_per_worker:
        env.append({"name": "CUDA_VISIBLE_DEVICES", "value": ""})
    container = {
        "name": "tensorflow",
        "image": image,
        "command": command,
        "ports": [{"name": port_name, "containerPort": port, "protocol": "TCP"}],
        "env": env,
        "volumeMounts": [{"name": "tfmagic-launcher", "mountPath": LAUNCHER_DIR, "readOnly": True}],
    }
    if gpus_per_worker and job != "ps":
        container["resources"] = {"limits": {"nvidia.com/gpu": gpus_per_worker}}
    return container


def _metadata(name: str, namespace: str | None, labels: dict | None = None) -> dict:
    meta: dict = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    if labels:
        meta["labels"] = labels
    return meta


def kubernetes_manifests(
    cluster: ClusterLike,
    *,
    image: str,
    program: str = "train.py",
    program_args: Sequence[str] = (),
    python: str = "python3",
    port: int = 2222,
    name: str = "tfmagic",
    namespace: str | None = None,
    tfjob: bool = False,
    gpus_per_worker: int = 0,
    strategy: str = "between-graph",
) -> str:
    """Kubernetes manifests (multi-document YAML) that run ``cluster``: ``kubectl apply -f``.

    Each task gets a headless Service named ``<name>-<job>-<i>``, a stable DNS
    name for its address, and a bare Pod of the same name whose ``TF_CONFIG``
    lists those names.  Pods, not Deployments: a Deployment's replicas are
    interchangeable, but a TensorFlow task has a fixed identity (its
    ``TF_CONFIG``), and a ps restarted behind the workers' backs would have lost
    its variables; ``restartPolicy: Never`` makes a failure visible instead.
    A ConfigMap carries the launcher, mounted at ``/etc/tfmagic``.  ps Pods get
    ``CUDA_VISIBLE_DEVICES=""``; with ``gpus_per_worker`` the other Pods ask for
    ``nvidia.com/gpu``.

    With ``tfjob=True`` the output is one Kubeflow ``TFJob`` (``kubeflow.org/v1``)
    instead of Services and Pods: the training operator then creates both and
    sets ``TF_CONFIG`` itself, and it watches the pods and ends the job.

    ``image`` must hold TensorFlow and ``program`` (a path inside the image).

    >>> docs = kubernetes_manifests({"ps": 1, "worker": 2}, image="registry.example/train:1")
    >>> docs.count("kind: Pod"), docs.count("kind: Service")
    (3, 3)
    """
    counts = job_counts(cluster)
    roles = role_args(counts, strategy)
    check_count("gpus_per_worker", gpus_per_worker)
    if not isinstance(image, str) or not _IMAGE.match(image):
        raise ExportError(
            f"image {image!r} is not a container image reference; pass the image that holds "
            "TensorFlow and your program, e.g. image='registry.example.com/me/train:1'"
        )
    one_line("program", program)
    one_line("python", python)
    check_args(program_args)
    configs = kubernetes_tf_configs(counts, name=name, port=port, namespace=namespace, tfjob=tfjob)
    base_labels = {"app.kubernetes.io/name": "tfmagic", "app.kubernetes.io/instance": name}
    header = [
        f"# Generated by tfmagic.export: {describe(counts)}; strategy {strategy}.",
        "# Apply with:  kubectl apply -f <this file>"
        + ("" if namespace else "   (objects go to the current namespace)"),
        "# Checked by tfmagic's tests (parsed, TF_CONFIG read back by TFConfigClusterResolver),",
        "# not on a real Kubernetes cluster.",
    ]
    volume = {"name": "tfmagic-launcher", "configMap": {"name": f"{name}-launcher"}}
    docs: list[dict] = [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": _metadata(f"{name}-launcher", namespace, base_labels),
            "data": {LAUNCHER_FILE: launcher_source()},
        }
    ]
    common = {
        "image": image,
        "python": python,
        "program": program,
        "program_args": list(program_args),
        "role_args": roles,
        "port": port,
        "gpus_per_worker": gpus_per_worker,
    }
    if tfjob:
        docs.append(_tfjob(counts, name, namespace, base_labels, volume, common))
    else:
        services, pods = [], []
        for job, n in counts.items():
            for i in range(n):
                dns = task_dns_name(name, job, i)
                labels = {**base_labels, "tfmagic/job": job, "tfmagic/task": f"{job}-{i}"}
                selector = {"app.kubernetes.io/instance": name, "tfmagic/task": f"{job}-{i}"}
                services.append(
                    {
                        "apiVersion": "v1",
                        "kind": "Service",
                        "metadata": _metadata(dns, namespace, labels),
                        "spec": {
                            "clusterIP": "None",
                            # the tasks look each other up while starting, before any is "ready"
                            "publishNotReadyAddresses": True,
                            "selector": selector,
                            "ports": [{"name": "tf", "port": port, "targetPort": port, "protocol": "TCP"}],
                        },
                    }
                )
                env = [{"name": "TF_CONFIG", "value": json.dumps(configs[f"{job}:{i}"])}]
                pods.append(
                    {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "metadata": _metadata(dns, namespace, labels),
                        "spec": {
                            "restartPolicy": "Never",
                            "containers": [_container(**common, port_name="tf", job=job, env=env)],
                            "volumes": [volume],
                        },
                    }
                )
        docs += services + pods
    return "\n".join(header) + "\n" + "".join("---\n" + to_yaml(doc) for doc in docs)


def _tfjob(
    counts: Mapping[str, int], name: str, namespace: str | None, base_labels: dict, volume: dict, common: dict
) -> dict:
    """One Kubeflow TFJob: the operator makes the Services and Pods and sets TF_CONFIG."""
    replicas = {}
    for job, n in counts.items():
        replicas[_TFJOB_REPLICA[job]] = {
            "replicas": n,
            "restartPolicy": "Never",
            "template": {
                "metadata": {"labels": {**base_labels, "tfmagic/job": job}},
                "spec": {
                    "containers": [_container(**common, port_name="tfjob-port", job=job, env=[])],
                    "volumes": [volume],
                },
            },
        }
    spec: dict = {"runPolicy": {"cleanPodPolicy": "Running"}}
    if "chief" not in counts:
        # The default policy ends the job when worker 0 succeeds, which would
        # stop the other workers of between-graph training mid-run.
        spec["successPolicy"] = "AllWorkers"
    spec["tfReplicaSpecs"] = replicas
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": _metadata(name, namespace, base_labels),
        "spec": spec,
    }
