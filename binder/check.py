"""Build the environment Binder builds, from binder/ alone, and run every notebook in it.

    python binder/check.py [--env DIR] [--keep] [--reuse] [--installer pip|uv] [01 04 ...]

What repo2docker does with this repository, short of the container: a fresh virtual
environment of this Python (binder/runtime.txt names 3.11), ``pip install -r
binder/requirements.txt`` from the repository's root (which installs tfmagic itself, not
editable, so the Jupyter server extension's config file is installed as on Binder), then
each notebook top to bottom in a kernel of that environment, with no SSH hosts and no
Spark (Binder has neither), measuring the peak memory (PSS) of the kernel and its tasks
with bench/notebook_memory.py. Exit status 1 when a notebook fails or passes 2 GB.

Not done here: the container itself (apt.txt's packages are this machine's), and Binder's
own limits (its cgroup): the memory column says what would fit.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def build(env: Path, installer: str = "pip") -> Path:
    """A fresh venv with binder/requirements.txt installed; its python.

    ``installer`` "pip" is what repo2docker runs; "uv" installs the same pinned versions (every
    requirement is exact, so there is nothing to resolve differently) in about a fifth of the time,
    which is what the test suite uses (tests/test_binder_env.py).
    """
    t0 = time.perf_counter()
    if installer == "uv":
        subprocess.run(["uv", "venv", "-q", "--python", sys.executable, str(env)], check=True)
    else:
        venv.EnvBuilder(with_pip=True, clear=True).create(env)
    python = env / "bin" / "python"
    print(f"installing binder/requirements.txt into {env} with {installer} ...", flush=True)
    if installer == "uv":
        command = ["uv", "pip", "install", "-q", "--python", str(python), "-r", "binder/requirements.txt"]
    else:
        command = [
            str(python),
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            # no bytecode for the 40,000 files installed: Python compiles what a kernel imports
            # (93 s against 70 s here, most of it TensorFlow)
            "--no-compile",
            "-r",
            "binder/requirements.txt",
        ]
    subprocess.run(command, cwd=ROOT, check=True)
    print(f"built in {time.perf_counter() - t0:.0f} s", flush=True)
    return python


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", type=Path, default=None, help="where to build it (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the environment afterwards")
    parser.add_argument(
        "--reuse", action="store_true", help="an environment already built at --env: reinstall only tfmagic"
    )
    parser.add_argument(
        "--installer",
        choices=("pip", "uv"),
        default="pip",
        help="pip (what repo2docker runs; the default) or uv (the same pinned versions, faster)",
    )
    parser.add_argument("notebooks", nargs="*", help="two-digit numbers (default: every notebook)")
    args = parser.parse_args()
    env = args.env or Path(tempfile.mkdtemp(prefix="tfmagic-binder-"))
    try:
        if args.reuse and (env / "bin" / "python").exists():
            python = env / "bin" / "python"
            subprocess.run(
                [str(python), "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", "."],
                cwd=ROOT,
                check=True,
            )
        else:
            python = build(env, args.installer)
        # not this checkout: the installed copy, as on Binder (run from elsewhere so '.' is not on the path)
        where = subprocess.run(
            [str(python), "-c", "import tfmagic; print(tfmagic.__file__)"],
            cwd=tempfile.gettempdir(),
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        print(f"tfmagic imported from {where}")
        config = env / "etc" / "jupyter" / "jupyter_server_config.d" / "tfmagic.json"
        print(
            "the Jupyter server extension is enabled by the install"
            if config.exists()
            else f"the Jupyter server extension is NOT enabled: {config} is missing"
        )
        clean = {k: v for k, v in os.environ.items() if not k.startswith(("TFMAGIC_DEMO_", "PYTHONPATH"))}
        clean["PATH"] = f"{env / 'bin'}{os.pathsep}{clean.get('PATH', '')}"
        done = subprocess.run(
            [str(python), str(ROOT / "bench" / "notebook_memory.py"), *args.notebooks],
            cwd=tempfile.gettempdir(),
            env=clean,
            capture_output=True,
            text=True,
        )
        print(done.stdout, end="")
        bad = [ln for ln in done.stdout.splitlines() if " failed: " in ln or "NOT Binder" in ln]
        if not config.exists():
            bad.append("server extension")
        if done.returncode != 0:
            print(done.stderr[-3000:], file=sys.stderr)
        return 1 if bad or done.returncode != 0 else 0
    finally:
        if not args.keep:
            shutil.rmtree(env, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
