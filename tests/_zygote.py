"""Rank processes forked from a warm interpreter that has imported torch already.

Every torch rank a test starts pays ``import torch`` (about 2 s of CPU here), and
the suite starts hundreds of them on a 2-core CI machine. ``run_world`` therefore
starts a torch script's ranks as forks of one server process (started once per
session) that imported numpy and torch and nothing else: not collectives, whose
import-time behaviour the tests check as users meet it. Each rank is still a
process of its own, in a session of its own, with its own environment, working
directory, stdout and stderr files and command line, running its script as
``__main__``; it talks to the others over real sockets and exits with its own
code. What differs from a fresh interpreter is only that numpy and torch are
imported already, with the environment the server started with; a rank whose
environment differs from it in anything read at import (PYTHON*, thread counts,
library paths, TORCH_*, JAX/XLA) is started with Popen instead, as is every
rank that does not import torch. Two servers, each with a hash seed of its own,
take the ranks alternately: neighbouring ranks differ in the order they iterate
sets of strings, as fresh interpreters do (a rank-divergent iteration order is a
bug the suite must still be able to meet). COLLECTIVES_TEST_FORK=0 turns this off.

The server forks on request and reports each child's exit status; pytest's side
is ``Forked``, which answers ``pid``, ``poll``, ``wait``, ``kill`` and
``returncode`` as ``subprocess.Popen`` does.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Mapping, Optional, Sequence

# variables read at import time by the interpreter, numpy or torch: a rank whose value
# differs from the server's starts as a fresh process instead
_SENSITIVE = ("PYTHON", "LD_", "OMP_", "OPENBLAS", "MKL_", "KMP_", "GOMP", "TORCH", "JAX",
              "XLA", "CUDA_", "MALLOC")

SERVER = r'''
import json, os, signal, socket, sys
import numpy, torch  # the warm part
sock = socket.socket(fileno=int(sys.argv[1]))
reader = sock.makefile("r")
children = set()

def reap():
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        children.discard(pid)
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        sock.sendall((json.dumps({"exit": pid, "code": code}) + "\n").encode())

def serve():
    import select
    while True:
        ready, _, _ = select.select([sock], [], [], 0.05)
        reap()
        if not ready:
            continue
        line = reader.readline()
        if not line:
            return None
        req = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            return req
        children.add(pid)
        sock.sendall((json.dumps({"pid": pid, "id": req["id"]}) + "\n").encode())

req = serve()
if req is None:
    sys.exit(0)
# the child: become the rank
reader.close()
sock.close()
signal.signal(signal.SIGCHLD, signal.SIG_DFL)
os.setsid()
fd = os.open(os.devnull, os.O_RDONLY)
os.dup2(fd, 0)
os.close(fd)
for target, path in ((1, req["out"]), (2, req["err"])):
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    os.dup2(fd, target)
    os.close(fd)
os.chdir(req["cwd"])
os.environ.clear()
os.environ.update(req["env"])
script = req["argv"][0]
sys.argv = list(req["argv"])
sys.path[0] = os.path.dirname(os.path.abspath(script))
del req, reader, sock, children, serve, reap
# what a fresh interpreter seeds from the OS (a fork would share the server's state)
import random
random.seed()
if "numpy.random" in sys.modules:
    numpy.random.seed()
import runpy
runpy.run_path(script, run_name="__main__")
'''


class _Server:
    """The forking server and the thread that reads its answers."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = dict(env)
        self.base = _sensitive(env)
        self.env.setdefault("PYTHONHASHSEED", str(int.from_bytes(os.urandom(4), "little")))
        ours, theirs = socket.socketpair()
        # its own output (nothing, unless it fails) goes to a file of its own, not to the
        # capture of whichever test started it
        log = tempfile.NamedTemporaryFile(prefix="collectives-zygote-", suffix=".log",
                                          delete=False)
        self.log = log.name
        self.proc = subprocess.Popen([sys.executable, "-c", SERVER, str(theirs.fileno())],
                                     pass_fds=[theirs.fileno()], env=self.env,
                                     stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                     start_new_session=True)
        log.close()
        theirs.close()
        self.sock = ours
        self.cv = threading.Condition()
        self.pids: dict = {}  # request id -> pid
        self.codes: dict = {}  # pid -> exit code
        self.next_id = 0
        self.alive = True
        threading.Thread(target=self._read, name="zygote-reader", daemon=True).start()

    def _read(self) -> None:
        reader = self.sock.makefile("r")
        try:
            for line in reader:
                msg = json.loads(line)
                with self.cv:
                    if "exit" in msg:
                        self.codes[msg["exit"]] = msg["code"]
                    else:
                        self.pids[msg["id"]] = msg["pid"]
                    self.cv.notify_all()
        finally:
            with self.cv:
                self.alive = False
                self.cv.notify_all()

    def start(self, argv: Sequence[str], env: Mapping[str, str], cwd: str, out: str,
              err: str) -> "Forked":
        with self.cv:
            rid = self.next_id = self.next_id + 1
            self.sock.sendall((json.dumps({"id": rid, "argv": list(argv), "env": dict(env),
                                           "cwd": cwd, "out": out, "err": err}) + "\n").encode())
            deadline = time.monotonic() + 30
            while rid not in self.pids:
                if not self.alive or time.monotonic() > deadline:
                    raise RuntimeError(f"the forking server did not answer (its log: "
                                       f"{self.log})")
                self.cv.wait(1.0)
            return Forked(self, self.pids.pop(rid))

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.returncode == 0:
            try:
                os.unlink(self.log)
            except OSError:
                pass


class Forked:
    """A rank forked by the server, answering as subprocess.Popen does."""

    def __init__(self, server: _Server, pid: int) -> None:
        self.server, self.pid = server, pid
        self.returncode: Optional[int] = None

    def poll(self) -> Optional[int]:
        with self.server.cv:
            if self.returncode is None and self.pid in self.server.codes:
                self.returncode = self.server.codes.pop(self.pid)
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.server.cv:
            while self.poll() is None:
                if not self.server.alive:
                    raise RuntimeError(f"the forking server ended before rank pid {self.pid}")
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
                self.server.cv.wait(0.5 if left is None else min(left, 0.5))
        return self.returncode  # type: ignore[return-value]

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


_SERVERS: dict = {}  # 0 or 1 -> _Server
_LOCK = threading.Lock()


def _sensitive(env: Mapping[str, str]) -> dict:
    """The variables of env read at import (the only ones a fork takes from the server:
    it sets every other one to the rank's own)."""
    return {k: v for k, v in env.items() if k.startswith(_SENSITIVE)}


def _imports_torch(path: str) -> bool:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return "torch" in f.read()
    except OSError:
        return False


def start(rank: int, argv: Sequence[str], env: Mapping[str, str], cwd: str, out: str,
          err: str, server_env: Mapping[str, str]) -> Optional[Forked]:
    """Rank `rank`, forked, running argv ([script, *args]), or None where it must start
    fresh (server_env: the environment a fresh rank would inherit but its own variables)."""
    if os.environ.get("COLLECTIVES_TEST_FORK", "1") == "0" or not _imports_torch(argv[0]):
        return None
    if _sensitive(env) != _sensitive(server_env):
        return None
    with _LOCK:
        server = _SERVERS.get(rank % 2)
        if server is not None and (not server.alive or server.base != _sensitive(server_env)):
            server.close()
            server = None
        if server is None:
            server = _SERVERS[rank % 2] = _Server(server_env)
    return server.start(argv, env, cwd, out, err)


def stop() -> None:
    """End the servers (their children are the tests' to end)."""
    with _LOCK:
        for server in _SERVERS.values():
            server.close()
        _SERVERS.clear()
