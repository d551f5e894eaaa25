"""An sshd in each host of a tests/_netns.py Cluster, for multi-host launcher tests (root).

``with SshHosts(cluster, tmp) as hosts:`` starts, in each host's network namespace and
under a UTS namespace with the host's hostname, an ``sshd -D`` that listens on the
host's address only and accepts one key made for this test (nothing else: no password,
no PAM, root by key only). ``hosts.env`` puts an ``ssh`` first on PATH that uses that
key and this test's own config (never ~/.ssh); ``hosts.run_in(h, argv)`` starts a
command inside host h, as a launcher there would run. On exit every process left in
the cluster's namespaces (the sshds, their sessions, the ranks) is killed before the
cluster deletes the namespaces.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

SSHD = "/usr/sbin/sshd"


class SshError(RuntimeError):
    """sshd is missing or did not come up."""


def _keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)],
                   check=True, capture_output=True, timeout=30)


class SshHosts:
    """An sshd per host of a Cluster; see the module docstring."""

    def __init__(self, cluster, tmp: Path) -> None:
        self.cluster = cluster
        self.tmp = Path(tmp)
        self.procs: list = []
        self.env: dict = {}

    def __enter__(self) -> "SshHosts":
        if not os.path.exists(SSHD):
            raise SshError(f"{SSHD} is missing (apt-get install openssh-server)")
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege separation dir
        key, hostkey = self.tmp / "id", self.tmp / "hostkey"
        _keygen(key)
        _keygen(hostkey)
        (self.tmp / "authorized_keys").write_text((self.tmp / "id.pub").read_text())
        bindir = self.tmp / "bin"
        bindir.mkdir(exist_ok=True)
        config = self.tmp / "ssh_config"
        config.write_text(f"Host *\n  IdentityFile {key}\n  IdentitiesOnly yes\n"
                          f"  UserKnownHostsFile /dev/null\n  StrictHostKeyChecking no\n"
                          f"  LogLevel ERROR\n  User root\n")
        (bindir / "ssh").write_text(f'#!/bin/sh\nexec /usr/bin/ssh -F {config} "$@"\n')
        (bindir / "ssh").chmod(0o755)
        self.env = {"PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"}
        try:
            for h in range(self.cluster.nhosts):
                cfg = self.tmp / f"sshd{h}.conf"
                cfg.write_text(
                    f"ListenAddress {self.cluster.addr(h)}\nPort 22\nHostKey {hostkey}\n"
                    f"AuthorizedKeysFile {self.tmp}/authorized_keys\n"
                    f"PidFile {self.tmp}/sshd{h}.pid\nPermitRootLogin prohibit-password\n"
                    f"PasswordAuthentication no\nKbdInteractiveAuthentication no\n"
                    f"UsePAM no\nStrictModes no\n")
                self.procs.append(self.run_in(h, [SSHD, "-D", "-e", "-f", str(cfg)],
                                              stdout=subprocess.DEVNULL,
                                              stderr=open(self.tmp / f"sshd{h}.log", "wb")))
            for h in range(self.cluster.nhosts):
                self._wait_listening(h)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _wait_listening(self, h: int, timeout: float = 20.0) -> None:
        probe = (f"import socket, time\nend = time.time() + {timeout}\nwhile True:\n"
                 f"    try:\n        socket.create_connection(('{self.cluster.addr(h)}', 22), 1)"
                 f".close(); break\n    except OSError:\n"
                 f"        if time.time() > end: raise\n        time.sleep(0.05)\n")
        res = subprocess.run(["ip", "netns", "exec", self.cluster.names[h], sys.executable,
                              "-c", probe], capture_output=True, text=True, timeout=timeout + 10)
        if res.returncode != 0:
            log = (self.tmp / f"sshd{h}.log").read_text(errors="replace")
            raise SshError(f"sshd on host {h} did not listen: {res.stderr[-500:]} {log[-1000:]}")

    def run_in(self, h: int, argv: list, **kwargs) -> subprocess.Popen:
        """Start argv inside host h (its network namespace and hostname)."""
        self.cluster.placement = [h]
        return subprocess.Popen(self.cluster.prefix(0) + list(argv), start_new_session=True,
                                **kwargs)

    def kill_host(self, h: int) -> None:
        """Every process of host h dies at once (a host lost), the sshd included."""
        out = subprocess.run(["ip", "netns", "pids", self.cluster.names[h]],
                             capture_output=True, text=True, timeout=30).stdout.split()
        for pid in out:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass

    def __exit__(self, *exc) -> None:
        for h in range(self.cluster.nhosts):
            self.kill_host(h)
        for p in self.procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        time.sleep(0.1)
