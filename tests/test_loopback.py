"""The bind guard: the preload library, its build cache, and real TF servers with and without it.

Real servers cost ~5 s each here, so one module-scoped pair (guarded and
unguarded) serves every test that needs one: three TensorFlow processes in
all, counting the client.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from tfmagic.network import bindguard
from tfmagic.network.ports import free_port

from .conftest import GRAPH_PROBE, poll_for

LOOPBACK = {"127.0.0.1", "::ffff:127.0.0.1"}
WILDCARD = {"0.0.0.0", "::"}


def _child_env(guarded: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "TFMAGIC_BIND_HOST")}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    if guarded:
        guard = bindguard.bind_guard("127.0.0.1", base_env=env)
        assert guard.available, guard.reason
        env.update(guard.env)
        env["TFMAGIC_BIND_DEBUG"] = "1"
    return env


# --- unit: the guard and its build cache ------------------------------------------------------


@pytest.mark.unit
def test_guard_is_available_here_and_preloads_an_existing_library():
    guard = bindguard.bind_guard()
    assert guard.available, guard.reason
    first = guard.env["LD_PRELOAD"].split(":")[0]
    assert first == guard.library
    assert Path(first).is_file() and first.endswith(".so")
    assert guard.env["TFMAGIC_BIND_HOST"] == "127.0.0.1"


@pytest.mark.unit
def test_existing_ld_preload_is_kept_after_ours_and_not_doubled():
    lib = bindguard.bind_guard().library
    guard = bindguard.bind_guard(base_env={"LD_PRELOAD": "/opt/other.so"})
    assert guard.env["LD_PRELOAD"] == f"{lib}:/opt/other.so"
    again = bindguard.bind_guard(base_env={"LD_PRELOAD": guard.env["LD_PRELOAD"]})
    assert again.env["LD_PRELOAD"] == f"{lib}:/opt/other.so"
    assert bindguard.bind_guard(base_env={}).env["LD_PRELOAD"] == lib


@pytest.mark.unit
@pytest.mark.parametrize("host", ["localhost", "::1", "127.0.0.1:80", "", "0.0.0.0"])
def test_a_host_that_is_not_one_ipv4_address_gives_no_guard_and_a_reason(host):
    guard = bindguard.bind_guard(host)
    assert not guard.available
    assert guard.env == {} and guard.library is None
    assert "every interface" in guard.reason and "\n" not in guard.reason


@pytest.mark.unit
def test_without_a_readable_socket_table_nobody_is_told_other_users_are_kept_out(monkeypatch):
    """The peer check reads /proc/net/tcp; where a sandbox hides it, the tasks are not asked to
    check, and the security line says anyone on this machine may send graphs."""
    from tfmagic.launchers import LocalLauncher

    assert bindguard.peers_checkable()
    assert bindguard.bind_guard("127.0.0.1").env["TFMAGIC_OWN_PEERS"] == "1"
    assert "admit your own processes only" in LocalLauncher().security_note()
    monkeypatch.setattr(bindguard, "peers_checkable", lambda: False)
    assert "TFMAGIC_OWN_PEERS" not in bindguard.bind_guard("127.0.0.1").env
    note = LocalLauncher().security_note()
    assert "by anyone on this machine" in note and "/proc/net/tcp" in note, note


@pytest.mark.unit
def test_library_key_changes_with_the_source():
    text = bindguard.source_text()
    assert bindguard.library_key(text) == bindguard.library_key(text)
    assert bindguard.library_key(text + "\n/* changed */\n") != bindguard.library_key(text)
    assert bindguard.library_key(text).startswith("bindhost-") and bindguard.library_key(text).endswith(".so")


@pytest.mark.unit
def test_library_is_built_into_the_cache_dir_under_its_key(tmp_path, monkeypatch):
    monkeypatch.setenv("TFMAGIC_CACHE_DIR", str(tmp_path / "cache"))
    guard = bindguard.bind_guard()
    assert guard.available, guard.reason
    expected = tmp_path / "cache" / bindguard.library_key(bindguard.source_text())
    assert guard.library == str(expected)
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [expected.name], "no temp files left"
    assert bindguard.bind_guard().library == str(expected)  # cached in-process


@pytest.mark.unit
def test_no_compiler_gives_a_reason_that_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv("TFMAGIC_CACHE_DIR", str(tmp_path / "nocc"))
    monkeypatch.setenv("CC", "no-such-compiler")
    monkeypatch.setenv("PATH", str(tmp_path))
    guard = bindguard.bind_guard()
    assert not guard.available and guard.env == {}
    assert "no C compiler" in guard.reason and "install gcc" in guard.reason


@pytest.mark.unit
def test_compile_failure_reports_the_compilers_last_line(tmp_path, monkeypatch):
    bad = tmp_path / "badcc"
    bad.write_text("#!/bin/sh\necho 'first line' >&2\necho 'fatal: broken compiler' >&2\nexit 1\n")
    bad.chmod(0o755)
    monkeypatch.setenv("TFMAGIC_CACHE_DIR", str(tmp_path / "badcache"))
    monkeypatch.setenv("CC", str(bad))
    guard = bindguard.bind_guard()
    assert not guard.available
    assert "fatal: broken compiler" in guard.reason and "first line" not in guard.reason
    assert not list((tmp_path / "badcache").iterdir()), "a failed build leaves nothing behind"


@pytest.mark.unit
def test_a_cache_path_ld_preload_cannot_carry_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("TFMAGIC_CACHE_DIR", str(tmp_path / "with space"))
    guard = bindguard.bind_guard()
    assert not guard.available and "TFMAGIC_CACHE_DIR" in guard.reason


# --- a cache others could write to: a planted library must never run -----------------------------

PLANTED_C = r"""
#include <fcntl.h>
#include <unistd.h>
__attribute__((constructor)) static void planted(void) {
    int fd = open(MARKER, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) { write(fd, "planted code ran\n", 17); close(fd); }
}
"""


@pytest.fixture
def planted(tmp_path):
    """A library that writes a marker file when loaded, built outside any cache; (path, marker)."""
    marker = tmp_path / "marker"
    src, lib = tmp_path / "planted.c", tmp_path / "planted.so"
    src.write_text(PLANTED_C)
    done = subprocess.run(
        ["cc", "-shared", "-fPIC", f'-DMARKER="{marker}"', "-o", str(lib), str(src)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    probe = subprocess.run(
        [sys.executable, "-c", "pass"], env={**os.environ, "LD_PRELOAD": str(lib)}, timeout=30
    )
    assert probe.returncode == 0 and marker.exists(), "the planted library works when it is preloaded"
    marker.unlink()
    return lib, marker


def _plant(lib: Path, directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / bindguard.library_key(bindguard.source_text())
    shutil.copy(lib, target)
    return target


def _runs_clean(guard: bindguard.BindGuard, marker: Path) -> None:
    """A process started with the guard's environment: guarded, and the planted code did not run."""
    env = {**_child_env(guarded=False), **guard.env}
    out = subprocess.run(
        [sys.executable, "-c", BIND_PROBE], env=env, capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["v4_any"][0] == "127.0.0.1", "the guard still works"
    assert not marker.exists(), "the planted library ran"


@pytest.mark.cluster
def test_a_library_planted_in_a_world_writable_cache_is_not_used(tmp_path, monkeypatch, planted):
    lib, marker = planted
    cache = tmp_path / "shared-cache"
    target = _plant(lib, cache)
    cache.chmod(0o777)
    monkeypatch.setenv("TFMAGIC_CACHE_DIR", str(cache))
    guard = bindguard.bind_guard()
    assert guard.available and guard.reason == "", "nothing alarming is said: the guard works"
    assert guard.library != str(target) and not guard.library.startswith(str(cache))
    assert os.stat(guard.library).st_uid == os.geteuid() and not os.stat(guard.library).st_mode & 0o022
    assert os.stat(os.path.dirname(guard.library)).st_mode & 0o777 == 0o700
    _runs_clean(guard, marker)
    # a task process started as the launchers start it: the planted code never runs in it
    env = {**_child_env(guarded=False), **guard.env}
    with open(tmp_path / "task.log", "wb") as log:
        task = subprocess.Popen(
            [sys.executable, "-m", "tfmagic.task_main"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            env=env,
            start_new_session=True,
        )
    try:
        hello = json.loads(task.stdout.readline())
        assert hello["event"] == "hello" and hello["bind_host"] == "127.0.0.1"
        assert guard.library in Path(f"/proc/{task.pid}/maps").read_text()
        assert not marker.exists(), "the planted library ran in a task"
    finally:
        task.kill()
        task.wait(timeout=10)
        task.stdin.close()
        task.stdout.close()
    assert target.read_bytes() == lib.read_bytes(), "the planted file is left alone, only not used"


@pytest.mark.unit
def test_a_cache_dir_owned_by_another_user_is_not_used(tmp_path, monkeypatch, planted):
    lib, marker = planted
    cache = tmp_path / "theirs"
    target = _plant(lib, cache)
    if os.geteuid() != 0:
        pytest.skip("needs root to give a directory to another user")
    import pwd

    nobody = pwd.getpwnam("nobody")
    os.chown(target, nobody.pw_uid, nobody.pw_gid)
    os.chown(cache, nobody.pw_uid, nobody.pw_gid)
    cache.chmod(0o755)
    monkeypatch.setenv("TFMAGIC_CACHE_DIR", str(cache))
    guard = bindguard.bind_guard()
    assert guard.available and not guard.library.startswith(str(cache))
    _runs_clean(guard, marker)


@pytest.mark.unit
def test_a_symlinked_library_in_a_private_cache_is_not_used(tmp_path, monkeypatch, planted):
    lib, marker = planted
    cache = tmp_path / "mine"
    cache.mkdir(mode=0o700)
    target = cache / bindguard.library_key(bindguard.source_text())
    target.symlink_to(lib)
    monkeypatch.setenv("TFMAGIC_CACHE_DIR", str(cache))
    guard = bindguard.bind_guard()
    assert guard.available
    assert not os.path.islink(guard.library) and os.path.isfile(guard.library)
    assert Path(guard.library).read_bytes() != lib.read_bytes()
    _runs_clean(guard, marker)


@pytest.mark.unit
def test_a_symlinked_cache_dir_is_not_used(tmp_path, monkeypatch, planted):
    lib, marker = planted
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    _plant(lib, real)
    link = tmp_path / "link"
    link.symlink_to(real)
    monkeypatch.setenv("TFMAGIC_CACHE_DIR", str(link))
    guard = bindguard.bind_guard()
    assert guard.available
    assert not guard.library.startswith(str(link)) and not guard.library.startswith(str(real))
    _runs_clean(guard, marker)


@pytest.mark.unit
def test_a_private_cache_under_a_parent_others_may_write_is_not_used(tmp_path, monkeypatch, planted):
    """Whoever may write the parent may swap the whole cache directory (no sticky bit here)."""
    lib, marker = planted
    parent = tmp_path / "open"
    cache = parent / "cache"
    _plant(lib, cache)
    cache.chmod(0o700)
    parent.chmod(0o777)
    monkeypatch.setenv("TFMAGIC_CACHE_DIR", str(cache))
    guard = bindguard.bind_guard()
    assert guard.available and not guard.library.startswith(str(parent))
    _runs_clean(guard, marker)
    parent.chmod(0o1777)  # with the sticky bit (as /tmp) others cannot rename what is ours
    bindguard._build.cache_clear()
    assert bindguard.bind_guard().library == str(cache / bindguard.library_key(bindguard.source_text()))
    assert not marker.exists()
    parent.chmod(0o700)


@pytest.mark.unit
def test_a_proper_private_cache_is_used_and_not_rebuilt(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("TFMAGIC_CACHE_DIR", str(cache))
    first = bindguard.bind_guard().library
    assert first == str(cache / bindguard.library_key(bindguard.source_text()))
    assert os.stat(cache).st_mode & 0o777 == 0o700 and os.stat(first).st_mode & 0o777 == 0o755
    before = os.stat(first)
    bindguard._build.cache_clear()  # as a new process would
    assert bindguard.bind_guard().library == first
    after = os.stat(first)
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns), "found, not rebuilt"


BIND_PROBE = textwrap.dedent(
    """
    import json, socket
    out = {}
    def bind(name, family, addr, v6only=None):
        s = socket.socket(family)
        if v6only is not None:
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, v6only)
        try:
            s.bind(addr)
            out[name] = list(s.getsockname()[:2])
        except OSError as e:
            out[name] = e.errno
        finally:
            s.close()
    bind("v4_any", socket.AF_INET, ("0.0.0.0", 0))
    bind("v4_lo", socket.AF_INET, ("127.0.0.1", 0))
    bind("v6_any", socket.AF_INET6, ("::", 0), v6only=0)
    bind("v6_lo", socket.AF_INET6, ("::1", 0))
    bind("v6only_any", socket.AF_INET6, ("::", 0), v6only=1)
    print(json.dumps(out))
    """
)


@pytest.mark.unit
def test_the_library_rewrites_only_wildcard_binds():
    """Plain Python sockets in a child (no TensorFlow): what each bind becomes."""
    env = _child_env(guarded=True)
    env["TFMAGIC_BIND_DEBUG"] = "0"
    out = subprocess.run(
        [sys.executable, "-c", BIND_PROBE], env=env, capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stderr
    assert out.stderr == "", "silent unless TFMAGIC_BIND_DEBUG=1"
    got = json.loads(out.stdout)
    assert got["v4_any"][0] == "127.0.0.1"
    assert got["v4_lo"][0] == "127.0.0.1"
    assert got["v6_any"][0] == "::ffff:127.0.0.1"
    assert got["v6_lo"][0] == "::1" or isinstance(got["v6_lo"], int)  # passes through (or no IPv6 here)
    # An IPv6-only socket cannot take a mapped address: it fails closed, never listens everywhere.
    assert got["v6only_any"] == errno.EINVAL

    del env["TFMAGIC_BIND_HOST"]  # preloaded but not asked to rewrite
    out = subprocess.run(
        [sys.executable, "-c", BIND_PROBE], env=env, capture_output=True, text=True, timeout=30
    )
    got = json.loads(out.stdout)
    assert got["v4_any"][0] == "0.0.0.0" and got["v6_any"][0] == "::"


DEAD_PEER_PROBE = textwrap.dedent(
    """
    import errno, json, socket, sys, time
    from tfmagic.network import bindguard
    seconds, host, port, wait = float(sys.argv[1]), sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    # Python's own socket module stands in for TensorFlow's libraries: same wrapper, same GOT patch
    changed = bindguard.dead_peer_this_process(seconds, match="lib-dynload/_socket") if seconds else 0
    s = socket.create_connection((host, port), timeout=10)
    tcp = socket.IPPROTO_TCP
    print(json.dumps({
        "changed": changed,
        "user_timeout": s.getsockopt(tcp, socket.TCP_USER_TIMEOUT),
        "keepalive": s.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
        "idle": s.getsockopt(tcp, socket.TCP_KEEPIDLE),
    }), flush=True)
    if sys.stdin.readline().strip() == "send":
        s.sendall(b"x" * 1000)
        s.settimeout(wait)
        start = time.monotonic()
        try:
            outcome = "answered" if s.recv(1) else "closed"
        except OSError as exc:  # socket.timeout (errno None) is TimeoutError, as is ETIMEDOUT
            outcome = "still waiting" if exc.errno is None else errno.errorcode.get(exc.errno, str(exc))
        print(json.dumps({"outcome": outcome, "after": round(time.monotonic() - start, 2)}), flush=True)
    """
)


def _dead_peer_probe(seconds: float, host: str, port: int, wait: float = 0.0) -> subprocess.Popen:
    env = {**_child_env(guarded=False), "PYTHONPATH": str(Path(__file__).parents[1])}
    return subprocess.Popen(
        [sys.executable, "-c", DEAD_PEER_PROBE, str(seconds), host, str(port), str(wait)],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


@pytest.mark.unit
def test_connections_opened_after_the_dead_peer_patch_give_up_on_a_silent_peer_in_its_time():
    """The kernel's TensorFlow gets the same wrapper (clientserver.give_up_on_silent_peers)."""
    import socket

    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        got = {}
        for seconds in (7.0, 0.0):
            probe = _dead_peer_probe(seconds, "127.0.0.1", port)
            try:
                got[seconds] = json.loads(probe.stdout.readline())
                probe.stdin.write("done\n")
                probe.stdin.close()
                assert probe.wait(30) == 0
            finally:
                probe.kill()
    assert got[7.0]["changed"] >= 1, got
    assert got[7.0]["user_timeout"] == 7000 and got[7.0]["keepalive"] == 1 and got[7.0]["idle"] == 2, got
    assert got[0.0]["user_timeout"] == 0 and got[0.0]["keepalive"] == 0, got  # TCP's own without it


# --- real TensorFlow servers ------------------------------------------------------------------

SERVER = textwrap.dedent(
    """
    import sys
    import tensorflow as tf
    port = int(sys.argv[1])
    spec = tf.train.ClusterSpec({"worker": [f"127.0.0.1:{port}"]})
    server = tf.distribute.Server(spec, job_name="worker", task_index=0)
    sys.stdin.read()  # runs until the test closes stdin or kills it
    """
)

CLIENT = textwrap.dedent(
    """
    import json, sys
    import tensorflow as tf
    results = {}
    for target in sys.argv[1:]:
        with tf.Graph().as_default():
            with tf.device("/job:worker/task:0"):
                x = tf.constant(6.0) * tf.constant(7.0)
            config = tf.compat.v1.ConfigProto(operation_timeout_in_ms=20000)
            with tf.compat.v1.Session(target, config=config) as session:
                results[target] = float(session.run(x))
    print(json.dumps(results))
    """
)


def _listening(pid: int, port: int) -> set[str]:
    return {
        c.laddr.ip
        for c in psutil.Process(pid).net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN and c.laddr.port == port
    }


class Server:
    def __init__(self, guarded: bool, log: Path):
        self.guarded = guarded
        self.port = free_port()
        self.log = log
        with open(log, "wb") as f:
            self.popen = subprocess.Popen(
                [sys.executable, "-c", SERVER, str(self.port)],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=f,
                env=_child_env(guarded),
            )

    def wait_listening(self, timeout: float = 90.0) -> set[str]:
        def listening():
            if self.popen.poll() is not None:
                tail = self.log.read_text(errors="replace").splitlines()[-5:]
                raise AssertionError(f"server exited with {self.popen.returncode}: {tail}")
            return _listening(self.popen.pid, self.port)

        return poll_for(listening, timeout, what=f"a server listening on {self.port}")

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait(timeout=10)
        self.popen.stdin.close()


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """A guarded and an unguarded worker server, started in parallel; killed by pid at the end."""
    logs = tmp_path_factory.mktemp("servers")
    started: list[Server] = []
    try:
        started.append(Server(True, logs / "guarded.log"))
        started.append(Server(False, logs / "open.log"))
        for server in started:
            server.wait_listening()
        yield {"guarded": started[0], "open": started[1]}
    finally:
        for server in started:
            server.stop()
        mine = {s.popen.pid for s in started}
        left = {p.pid for p in psutil.Process().children(recursive=True)} & mine
        assert not left, f"server processes left behind: {left}"


@pytest.mark.cluster
def test_a_guarded_server_listens_on_loopback_only(servers):
    server = servers["guarded"]
    addrs = _listening(server.popen.pid, server.port)
    assert addrs and addrs <= LOOPBACK, addrs
    every = {
        c.laddr.ip for c in psutil.Process(server.popen.pid).net_connections("tcp") if c.status == "LISTEN"
    }
    assert not every & WILDCARD, f"a wildcard listener on another port: {every}"
    assert (
        f"tfmagic bindhost: [::]:{server.port} -> [::ffff:127.0.0.1]:{server.port}"
        in server.log.read_text(errors="replace")
    )


@pytest.mark.cluster
def test_an_unguarded_server_listens_on_every_interface(servers):
    """The opposite case, so the test above can fail."""
    server = servers["open"]
    assert _listening(server.popen.pid, server.port) & WILDCARD


@pytest.mark.cluster
def test_a_loopback_client_runs_ops_on_the_guarded_server(servers):
    port = servers["guarded"].port
    targets = [f"grpc://127.0.0.1:{port}", f"grpc://localhost:{port}"]
    client = subprocess.Popen(
        [sys.executable, "-c", CLIENT, *targets],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_child_env(guarded=False),
    )
    try:
        out, err = client.communicate(timeout=120)
    finally:
        if client.poll() is None:
            client.kill()
            client.wait(timeout=10)
    assert client.returncode == 0, err.splitlines()[-5:]
    assert json.loads(out) == {t: 42.0 for t in targets}
    assert not psutil.pid_exists(client.pid) or psutil.Process(client.pid).status() == psutil.STATUS_ZOMBIE


@pytest.mark.cluster
@pytest.mark.skipif(os.getuid() != 0, reason="connecting as another user needs root")
def test_another_users_connection_is_closed_before_grpc_reads_a_byte(servers):
    """The guarded server closes a connection whose socket belongs to another user (the socket
    table says so) and says so in its log; the unguarded one serves it, so this test can fail."""
    import pwd

    from .test_cluster import bytes_answered

    nobody = pwd.getpwnam("nobody").pw_uid
    guarded, open_ = servers["guarded"], servers["open"]
    assert bytes_answered(guarded.port, user=nobody) == 0
    assert bytes_answered(guarded.port) > 0
    assert bytes_answered(open_.port, user=nobody) > 0
    assert "another user's process" in guarded.log.read_text(errors="replace")


def as_another_user(code: str, *args: str, user: str = "nobody", timeout: float = 120) -> dict:
    """Run ``code`` with this Python and its TensorFlow as another Unix user, and return the JSON
    it prints.  This Python may live where other users cannot enter (``/root``, mode 0700): a
    mount namespace of the child's own binds its installation onto a folder they can read, as
    another user's own installation would be, without changing any permission on this machine."""
    import pwd
    import shlex
    import site
    import tempfile

    prefix = Path(sys.base_prefix).resolve()
    executable = Path(sys.executable).resolve()
    mount = Path(tempfile.mkdtemp(prefix="tfmagic-other-user-"))
    mount.chmod(0o755)
    inside = mount / executable.relative_to(prefix) if executable.is_relative_to(prefix) else executable

    def seen(path: str) -> str:
        path_ = Path(path).resolve()
        return str(mount / path_.relative_to(prefix)) if path_.is_relative_to(prefix) else str(path_)

    sitedirs = [seen(d) for d in [*site.getsitepackages(), *sys.path] if d and Path(d).is_dir()]
    entry = pwd.getpwnam(user)
    inner = " ".join(
        [
            f"mount --bind {shlex.quote(str(prefix))} {shlex.quote(str(mount))} &&",
            f"exec setpriv --reuid={entry.pw_uid} --regid={entry.pw_gid} --clear-groups",
            shlex.quote(str(inside)),
            "-c",
            shlex.quote(code),
            *map(shlex.quote, args),
        ]
    )
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": "/tmp",
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "TFMAGIC_TEST_SITEDIRS": os.pathsep.join(dict.fromkeys(sitedirs)),
    }
    try:
        done = subprocess.run(
            ["unshare", "-m", "--propagation", "private", "sh", "-c", inner],
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout,
        )
    finally:
        shutil.rmtree(mount, ignore_errors=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.cluster
@pytest.mark.skipif(
    os.getuid() != 0 or shutil.which("unshare") is None or shutil.which("setpriv") is None,
    reason="running as another user needs root, unshare and setpriv (util-linux)",
)
def test_another_users_tensorflow_graph_is_refused_and_runs_on_an_unguarded_server(servers):
    """Issue 24 item 0 with a second real user running TensorFlow itself (not only a socket): the
    user ``nobody``, in its own Python process with this TensorFlow, sends a graph to each server.
    The guarded server (the bind library's peer check, as every tfmagic task has it) never runs
    it; the unguarded one does, so the test can fail."""
    import pwd

    guarded = f"grpc://127.0.0.1:{servers['guarded'].port}"
    open_ = f"grpc://127.0.0.1:{servers['open'].port}"
    said = as_another_user(GRAPH_PROBE, guarded, open_)
    assert said["uid"] == pwd.getpwnam("nobody").pw_uid
    assert said[open_] == 42.0, said
    assert said[guarded] in ("UnavailableError", "DeadlineExceededError"), said
    assert "another user's process" in servers["guarded"].log.read_text(errors="replace")


# --- another host: a network namespace on a veth pair ------------------------------------------

HOST_ADDR, NS_ADDR = "10.241.0.1", "10.241.0.2"

CONNECT = textwrap.dedent(
    """
    import errno, json, socket, sys
    out = {}
    for port in map(int, sys.argv[2:]):
        try:
            socket.create_connection((sys.argv[1], port), timeout=2).close()
            out[port] = "connected"
        except socket.timeout:
            out[port] = "timeout"
        except OSError as e:
            out[port] = errno.errorcode.get(e.errno, str(e))
    print(json.dumps(out))
    """
)


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10)


@pytest.fixture
def netns():
    """A network namespace joined to this host by a veth pair: 10.241.0.1 here, 10.241.0.2 there."""
    if shutil.which("ip") is None:
        pytest.skip("needs the ip command (iproute2) to create a network namespace")
    if os.geteuid() != 0:
        pytest.skip("needs root to create a network namespace")
    if "10.241.0." in _ip("-4", "addr").stdout:
        pytest.skip("10.241.0.0/30 is already in use on this host")
    name, host_if, ns_if = (
        f"tfmtest{os.getpid()}",
        f"tfmh{os.getpid() % 100000}",
        f"tfmn{os.getpid() % 100000}",
    )
    made = _ip("netns", "add", name)
    if made.returncode != 0:
        pytest.skip(f"cannot create a network namespace here: {made.stderr.strip()}")
    try:
        steps = [
            ("link", "add", host_if, "type", "veth", "peer", "name", ns_if),
            ("link", "set", ns_if, "netns", name),
            ("addr", "add", f"{HOST_ADDR}/30", "dev", host_if),
            ("link", "set", host_if, "up"),
            ("-n", name, "addr", "add", f"{NS_ADDR}/30", "dev", ns_if),
            ("-n", name, "link", "set", ns_if, "up"),
            ("-n", name, "link", "set", "lo", "up"),
        ]
        for step in steps:
            done = _ip(*step)
            assert done.returncode == 0, f"ip {' '.join(step)}: {done.stderr.strip()}"
        yield name
    finally:
        _ip("netns", "del", name)
        if _ip("link", "show", host_if).returncode == 0:
            _ip("link", "del", host_if)
        assert name not in _ip("netns", "list").stdout


@pytest.mark.cluster
def test_from_another_network_only_the_unguarded_server_is_reachable(servers, netns):
    guarded, open_ = servers["guarded"].port, servers["open"].port
    out = subprocess.run(
        ["ip", "netns", "exec", netns, sys.executable, "-c", CONNECT, HOST_ADDR, str(open_), str(guarded)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    got = {int(k): v for k, v in json.loads(out.stdout).items()}
    if got[open_] == "timeout":
        pytest.skip("a host firewall drops traffic from the namespace, so exposure cannot be shown here")
    assert got[open_] == "connected", got
    assert got[guarded] == "ECONNREFUSED", got


SILENT_LISTENER = textwrap.dedent(
    """
    import socket, sys, time
    listener = socket.create_server((sys.argv[1], 0))
    print(listener.getsockname()[1], flush=True)
    conns = [listener.accept() for _ in range(2)]
    time.sleep(300)  # holds both connections, reads nothing, says nothing
    """
)


@pytest.mark.cluster
def test_a_peer_whose_link_dies_fails_the_waiting_call_in_the_patched_time_not_tcps_minutes(netns):
    """A node that dies without a word: before the wrapper, a call waiting on it waited until TCP
    gave up (about 15 minutes; TensorFlow's call to a dead Slurm node held the kernel that long)."""
    listener = subprocess.Popen(
        ["ip", "netns", "exec", netns, sys.executable, "-c", SILENT_LISTENER, NS_ADDR],
        stdout=subprocess.PIPE,
        text=True,
    )
    probes = []
    try:
        port = int(listener.stdout.readline())
        for seconds, wait in ((2.0, 20.0), (0.0, 6.0)):
            probe = _dead_peer_probe(seconds, NS_ADDR, port, wait)
            probes.append(probe)
            json.loads(probe.stdout.readline())  # connected
        _ip("-n", netns, "link", "set", f"tfmn{os.getpid() % 100000}", "down")  # the peer goes silent
        for probe in probes:
            probe.stdin.write("send\n")
            probe.stdin.flush()
        patched, plain = (json.loads(p.stdout.readline()) for p in probes)
    finally:
        for proc in (listener, *probes):
            proc.kill()
            proc.wait(10)
    assert patched["outcome"] == "ETIMEDOUT" and patched["after"] < 10, patched
    assert plain["outcome"] == "still waiting", plain  # TCP's own: the call would wait on
