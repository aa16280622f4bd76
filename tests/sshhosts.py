"""Real SSH hosts for the tests: a private ``sshd`` on loopback, and sshd hosts
in network namespaces (each its own address on a private bridge), so that
"remote" really is another address that this machine reaches over a network.

Everything is made under one temp directory (host keys, a client key,
``authorized_keys``, ``known_hosts``, an ``ssh_config`` naming every host), and
every process and namespace is ended by the ``close()`` of what made it.
Known-hosts checking stays on (``StrictHostKeyChecking yes``), as a user's
setup would have it.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tfmagic.network.ports import free_port

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


def skip_reason() -> str | None:
    """Why SSH tests cannot run here, or None."""
    if not os.path.exists(SSHD):
        return "needs OpenSSH's sshd (apt-get install openssh-server)"
    if shutil.which("ssh") is None or shutil.which("ssh-keygen") is None:
        return "needs the OpenSSH client (apt-get install openssh-client)"
    return None


def netns_skip_reason() -> str | None:
    """Why network-namespace hosts cannot be made here, or None."""
    if skip_reason():
        return skip_reason()
    if os.geteuid() != 0:
        return "network-namespace hosts need root (ip netns, a bridge)"
    if shutil.which("ip") is None:
        return "network-namespace hosts need the ip command (iproute2)"
    return None


def _run(*cmd: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
    out = subprocess.run(list(cmd), capture_output=True, text=True, timeout=30, **kw)
    if check and out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {out.stderr.strip()}")
    return out


def _wait_port(host: str, port: int, netns: str | None, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection((host, port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"sshd on {host}:{port} did not come up in {timeout:g} s")


@dataclass
class SSHHosts:
    """Hosts reachable with ``ssh -F self.config <alias>``."""

    root: Path
    config: Path
    aliases: list[str] = field(default_factory=list)
    addresses: dict[str, str] = field(default_factory=dict)
    sshd: list[subprocess.Popen] = field(default_factory=list)
    namespaces: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)

    def ssh(self, alias: str, command: str, timeout: float = 30) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["ssh", "-F", str(self.config), "-o", "BatchMode=yes", alias, command],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )

    def close(self) -> None:
        for proc in self.sshd:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)
        for ns in self.namespaces:
            _run("ip", "netns", "del", ns, check=False)
        for link in self.links:
            _run("ip", "link", "del", link, check=False)
        shutil.rmtree(self.root, ignore_errors=True)


def _keys(root: Path) -> tuple[Path, Path]:
    host_key, user_key = root / "host_ed25519", root / "id_ed25519"
    for key in (host_key, user_key):
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key))
    shutil.copy(f"{user_key}.pub", root / "authorized_keys")
    return host_key, user_key


def _start_sshd(root: Path, name: str, host_key: Path, listen: str, port: int, netns: str | None):
    cfg = root / f"sshd_{name}.conf"
    cfg.write_text(
        "\n".join(
            [
                f"Port {port}",
                f"ListenAddress {listen}",
                f"HostKey {host_key}",
                f"AuthorizedKeysFile {root / 'authorized_keys'}",
                f"PidFile {root / f'sshd_{name}.pid'}",
                "PermitRootLogin prohibit-password",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "UsePAM no",
                "StrictModes no",
                "PrintMotd no",
                "AcceptEnv no",
                "ClientAliveInterval 5",
                "",
            ]
        )
    )
    os.makedirs("/run/sshd", exist_ok=True)
    cmd = [SSHD, "-D", "-e", "-f", str(cfg)]
    if netns:
        cmd = ["ip", "netns", "exec", netns, *cmd]
    log = open(root / f"sshd_{name}.log", "ab")  # noqa: SIM115 - handed to the child
    try:
        return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    finally:
        log.close()


def _client_config(
    hosts: SSHHosts, user_key: Path, host_key: Path, entries: list[tuple[str, str, int]]
) -> None:
    pub = Path(f"{host_key}.pub").read_text().split()
    known = []
    lines = []
    for alias, address, port in entries:
        known.append(
            f"[{address}]:{port} {pub[0]} {pub[1]}" if port != 22 else f"{address} {pub[0]} {pub[1]}"
        )
        lines += [
            f"Host {alias}",
            f"  HostName {address}",
            f"  Port {port}",
            "  User root",
            f"  IdentityFile {user_key}",
            "  IdentitiesOnly yes",
            f"  UserKnownHostsFile {hosts.root / 'known_hosts'}",
            "  StrictHostKeyChecking yes",
            "  LogLevel ERROR",
            "",
        ]
    (hosts.root / "known_hosts").write_text("\n".join(known) + "\n")
    hosts.config.write_text("\n".join(lines))


def loopback_host() -> SSHHosts:
    """One private sshd on 127.0.0.1 (alias ``loop``)."""
    root = Path(tempfile.mkdtemp(prefix="tfmagic-sshd-"))
    hosts = SSHHosts(root=root, config=root / "ssh_config")
    try:
        host_key, user_key = _keys(root)
        port = free_port()
        hosts.sshd.append(_start_sshd(root, "loop", host_key, "127.0.0.1", port, None))
        _client_config(hosts, user_key, host_key, [("loop", "127.0.0.1", port)])
        hosts.aliases.append("loop")
        hosts.addresses["loop"] = "127.0.0.1"
        _wait_port("127.0.0.1", port, None)
    except BaseException:
        hosts.close()
        raise
    return hosts


def _namespace(hosts: SSHHosts, bridge: str, name: str, outside: str, inside: str, address: str) -> str:
    """Namespace ``tfmns<name>`` joined to ``bridge`` by a veth pair (``tfmv<outside>`` here,
    ``tfmv<inside>`` in it, at ``address``/24); recorded in ``hosts`` for ``close()``."""
    ns, outside, inside = f"tfmns{name}", f"tfmv{outside}", f"tfmv{inside}"
    _run("ip", "netns", "add", ns)
    hosts.namespaces.append(ns)
    _run("ip", "link", "add", outside, "type", "veth", "peer", "name", inside)
    hosts.links.append(outside)
    _run("ip", "link", "set", inside, "netns", ns)
    _run("ip", "link", "set", outside, "master", bridge)
    _run("ip", "link", "set", outside, "up")
    _run("ip", "-n", ns, "addr", "add", f"{address}/24", "dev", inside)
    _run("ip", "-n", ns, "link", "set", inside, "up")
    _run("ip", "-n", ns, "link", "set", "lo", "up")
    return ns


#: A /24 for the namespace hosts' bridge; checked free before use.
SUBNET = "10.243.7"


def namespace_hosts(count: int = 2) -> SSHHosts:
    """``count`` hosts, each a network namespace with its own sshd, on one bridge.

    This machine is ``SUBNET.1``; host ``i`` is ``SUBNET.(10+i)`` (alias
    ``node<i>``).  Processes in a namespace share this machine's files and
    Python, as nodes sharing an NFS home would, but have their own network:
    their loopback is theirs, and everything else crosses the bridge.
    """
    if SUBNET + "." in _run("ip", "-4", "addr").stdout:
        raise RuntimeError(f"{SUBNET}.0/24 is already in use on this host")
    root = Path(tempfile.mkdtemp(prefix="tfmagic-nshosts-"))
    hosts = SSHHosts(root=root, config=root / "ssh_config")
    tag = os.getpid() % 100000
    bridge = f"tfmbr{tag}"
    try:
        host_key, user_key = _keys(root)
        _run("ip", "link", "add", bridge, "type", "bridge")
        hosts.links.append(bridge)
        _run("ip", "addr", "add", f"{SUBNET}.1/24", "dev", bridge)
        _run("ip", "link", "set", bridge, "up")
        entries = []
        for i in range(count):
            address = f"{SUBNET}.{10 + i}"
            ns = _namespace(hosts, bridge, f"{tag}-{i}", f"{tag}h{i}", f"{tag}n{i}", address)
            alias = f"node{i}"
            hosts.sshd.append(_start_sshd(root, alias, host_key, address, 22, ns))
            entries.append((alias, address, 22))
            hosts.aliases.append(alias)
            hosts.addresses[alias] = address
        _client_config(hosts, user_key, host_key, entries)
        for alias in hosts.aliases:
            _wait_port(hosts.addresses[alias], 22, None)
    except BaseException:
        hosts.close()
        raise
    return hosts


def stranger(hosts: SSHHosts, last: int = 99) -> str:
    """One more namespace on the hosts' bridge (``SUBNET.<last>``), running no sshd: a machine of the
    same network that is not part of any cluster.  Returns its name; ``hosts.close()`` removes it."""
    tag = os.getpid() % 100000
    bridge = next(link for link in hosts.links if link.startswith("tfmbr"))
    return _namespace(hosts, bridge, f"{tag}-x{last}", f"{tag}hx{last}", f"{tag}nx{last}", f"{SUBNET}.{last}")


if __name__ == "__main__":  # a manual check: python tests/sshhosts.py
    made = loopback_host() if "--loop" in sys.argv else namespace_hosts(2)
    try:
        for a in made.aliases:
            print(a, made.ssh(a, "hostname -I; echo ok").stdout.strip())
    finally:
        made.close()
