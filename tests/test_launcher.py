"""Tests of collectives-run (collectives/launcher/cli.py): placement, output, failures, signals."""

import os
import shlex
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from collectives.launcher import cli as run

pytestmark = pytest.mark.timeout(60)

from conftest import REPO, RUN_CWD, package_path  # noqa: E402


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(package_path() + [env.get("PYTHONPATH", "")])
    env["PYTHONUNBUFFERED"] = "1"
    for name in list(env):
        if name.startswith("COLLECTIVES_"):
            del env[name]
    return env


def launcher(*args, **kwargs):
    """Run collectives-run to completion; returns the CompletedProcess."""
    return subprocess.run([sys.executable, "-m", "collectives.run", *args],
                          capture_output=True, text=True, env=_env(), timeout=30,
                          cwd=RUN_CWD, **kwargs)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (not yet reaped by whoever inherited it) is not running.
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _wait_gone(pids, deadline_s=10.0):
    end = time.monotonic() + deadline_s
    while time.monotonic() < end and any(_alive(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


# ---------------------------------------------------------------- running

ENV_DUMP = textwrap.dedent("""
    import os, sys
    keys = ["RANK", "SIZE", "LOCAL_RANK", "LOCAL_SIZE", "STORE_ADDR", "IFNAME",
            "TIMEOUT", "START_TIMEOUT"]
    print(" ".join(k + "=" + os.environ.get("COLLECTIVES_" + k, "-") for k in keys))
    print("extra=" + os.environ.get("EXTRA_VAR", "-"))
    print("to stderr", file=sys.stderr)
""")


def test_prefixes_and_environment():
    res = launcher("-np", "3", "--network-interface", "lo", "--timeout", "42",
                   "--start-timeout", "9", "-x", "EXTRA_VAR=hello",
                   sys.executable, "-c", ENV_DUMP)
    assert res.returncode == 0, res.stderr
    out = res.stdout.splitlines()
    err = res.stderr.splitlines()
    assert len(out) == 6 and len(err) == 3
    addrs = set()
    for rank in range(3):
        mine = [line for line in out if line.startswith(f"[{rank}]<stdout>:")]
        assert len(mine) == 2, out
        fields = dict(kv.split("=", 1) for kv in mine[0].split(":", 1)[1].split())
        assert fields["RANK"] == str(rank)
        assert fields["SIZE"] == "3"
        assert fields["LOCAL_RANK"] == str(rank)
        assert fields["LOCAL_SIZE"] == "3"
        assert fields["IFNAME"] == "lo"
        assert fields["TIMEOUT"] == "42"
        assert fields["START_TIMEOUT"] == "9"
        addrs.add(fields["STORE_ADDR"])
        assert mine[1] == f"[{rank}]<stdout>:extra=hello"
        assert f"[{rank}]<stderr>:to stderr" in err
    (addr,) = addrs  # one store address for the whole job
    host, port = addr.rsplit(":", 1)
    assert host == "127.0.0.1" and 0 < int(port) < 65536


def test_partial_last_line_and_no_mid_line_interleaving():
    code = textwrap.dedent("""
        import os, sys
        r = os.environ["COLLECTIVES_RANK"]
        for i in range(200):
            sys.stdout.write(("r%s-%d-" % (r, i)) * 20 + "\\n")
            sys.stdout.flush()
        sys.stdout.write("tail" + r)
    """)
    res = launcher("-np", "4", sys.executable, "-c", code)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert len(lines) == 4 * 201
    for line in lines:
        prefix, _, text = line.partition(">:")
        rank = prefix[1:prefix.index("]")]
        if text.startswith("tail"):
            assert text == "tail" + rank
        else:
            parts = text.split("-")
            assert parts[0] == f"r{rank}" and len(set(parts[1::2])) == 1, line


def _read_until(pipe, needle: bytes, deadline: float) -> bytes:
    """Bytes from pipe until needle shows up or the deadline passes."""
    import select

    got = b""
    while needle not in got and time.monotonic() < deadline:
        ready, _, _ = select.select([pipe], [], [], 0.1)
        if ready:
            chunk = os.read(pipe.fileno(), 1 << 16)
            if not chunk:
                break
            got += chunk
    return got


@pytest.mark.timeout(40)
def test_carriage_return_progress_is_forwarded_as_it_comes(tmp_path):
    """A tqdm-style bar ("\\r text", no newline until the end) reaches our stderr, rank
    prefix and all, while the rank is still running and waiting for us to see it."""
    go = tmp_path / "go"
    code = textwrap.dedent(f"""
        import os, sys, time
        sys.stderr.write("\\r 10%|#")
        sys.stderr.flush()
        end = time.monotonic() + 20
        while not os.path.exists({str(go)!r}) and time.monotonic() < end:
            time.sleep(0.02)
        sys.stderr.write("\\r 50%|#####\\r100%|##########|\\n")
        sys.stderr.write("done\\r\\n")
        sys.stderr.flush()
    """)
    proc = subprocess.Popen([sys.executable, "-m", "collectives.run", "-np", "1", sys.executable,
                             "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env=_env(), cwd=RUN_CWD, start_new_session=True)
    try:
        early = _read_until(proc.stderr, b"[0]<stderr>: 10%|#", time.monotonic() + 15)
        assert early == b"[0]<stderr>: 10%|#", early  # forwarded before any newline
        assert proc.poll() is None
        go.touch()
        rest = proc.stderr.read()
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        proc.stderr.close()
    assert early + rest == (b"[0]<stderr>: 10%|#\r[0]<stderr>: 50%|#####\r"
                            b"[0]<stderr>:100%|##########|\n[0]<stderr>:done\r\n"), rest


# Ranks that must be running (and ready) before another fails touch a file in
# SYNC_DIR; the failing rank waits for them, so the tests do not depend on how
# fast the machine starts processes.
SYNC = textwrap.dedent("""
    import glob, os, sys, time
    sync_dir = os.environ["SYNC_DIR"]
    def ready():
        open(os.path.join(sync_dir, str(os.getpid())), "w").close()
    def wait_ready(n):
        end = time.monotonic() + 20
        while len(glob.glob(os.path.join(sync_dir, "*"))) < n and time.monotonic() < end:
            time.sleep(0.01)
""")


def _fail_when_others_ready(failing_rank: int, others: int) -> str:
    """A rank script: failing_rank exits 3 once the others, each printing its
    pid and sleeping, are ready."""
    return SYNC + textwrap.dedent(f"""
        if os.environ["COLLECTIVES_RANK"] == "{failing_rank}":
            wait_ready({others})
            sys.exit(3)
        print(os.getpid(), flush=True)
        ready()
        time.sleep(60)
    """)


def test_failing_rank_stops_the_others_quickly(tmp_path):
    code = _fail_when_others_ready(2, 3)
    start = time.monotonic()
    res = launcher("-np", "4", "-x", f"SYNC_DIR={tmp_path}", sys.executable, "-c", code)
    assert time.monotonic() - start < 10
    assert res.returncode == 3
    assert "collectives-run: rank 2 exited with code 3 first; stopped the other 3 ranks" \
        in res.stderr
    pids = [int(line.split(":", 1)[1]) for line in res.stdout.splitlines()]
    assert len(pids) == 3
    assert _wait_gone(pids, 2) == []


def _has_pidfd() -> bool:
    try:
        os.close(os.pidfd_open(os.getpid()))
    except (AttributeError, OSError):
        return False
    return True


@pytest.mark.skipif(not _has_pidfd(), reason="no pidfd_open here (Python < 3.9 or Linux < 5.3): "
                    "the launcher then checks its ranks every 50 ms")
def test_launcher_sleeps_while_its_ranks_run():
    """The launcher shares the cores with its ranks: while they run quietly it sleeps in
    epoll (woken by a rank's exit through its pidfd), not every 50 ms as it used to."""
    proc = subprocess.Popen([sys.executable, "-m", "collectives.run", "-np", "2", sys.executable,
                             "-c", "import time; print('up', flush=True); time.sleep(3.5)"],
                            stdout=subprocess.PIPE, text=True, env=_env(), cwd=RUN_CWD)
    try:
        for _ in range(2):
            assert proc.stdout.readline().endswith("up\n")

        def switches() -> int:
            with open(f"/proc/{proc.pid}/status") as fh:
                return sum(int(line.split()[1]) for line in fh if "ctxt_switches" in line)
        before = switches()
        time.sleep(2)
        woke = switches() - before
        assert proc.wait(timeout=20) == 0
        assert woke <= 8, f"the launcher woke {woke} times in 2 s"
    finally:
        proc.kill()
        proc.wait()


def test_rank_killed_by_signal_returns_128_plus_signal():
    code = ("import os, signal, time\n"
            "if os.environ['COLLECTIVES_RANK'] == '1': os.kill(os.getpid(), signal.SIGKILL)\n"
            "time.sleep(60)")
    res = launcher("-np", "2", sys.executable, "-c", code)
    assert res.returncode == 128 + signal.SIGKILL
    assert "rank 1 was killed by signal 9 (SIGKILL) first" in res.stderr


def test_rank_ignoring_sigterm_is_killed_after_grace(tmp_path):
    code = SYNC + textwrap.dedent("""
        import signal
        if os.environ["COLLECTIVES_RANK"] == "0":
            wait_ready(1)
            sys.exit(1)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print(os.getpid(), flush=True)
        ready()
        time.sleep(60)
    """)
    start = time.monotonic()
    res = launcher("-np", "2", "--kill-grace", "1", "-x", f"SYNC_DIR={tmp_path}",
                   sys.executable, "-c", code)
    assert res.returncode == 1
    assert 1.0 <= time.monotonic() - start < 10
    pid = int(res.stdout.split(":", 1)[1])
    assert _wait_gone([pid], 2) == []


def test_all_ranks_succeed_returns_zero():
    assert launcher("-np", "2", sys.executable, "-c", "pass").returncode == 0


def test_missing_command_is_an_error():
    res = launcher("-np", "2", "/no/such/program")
    assert res.returncode == 127 and "/no/such/program" in res.stderr
    assert launcher("-np", "2").returncode == 2


def test_too_many_ranks_for_slots():
    res = launcher("-np", "5", "-H", "localhost:2", sys.executable, "-c", "pass")
    assert res.returncode == 2 and "slots" in res.stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_to_launcher_stops_every_rank(sig):
    code = textwrap.dedent("""
        import os, time, subprocess, sys
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        print(os.getpid(), child.pid, flush=True)
        time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-m", "collectives.run", "-np", "3",
                             sys.executable, "-c", code],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env(), cwd=RUN_CWD)
    pids = []
    try:
        while len(pids) < 6:
            line = proc.stdout.readline()
            assert line, proc.stderr.read()
            pids += [int(p) for p in line.split(":", 1)[1].split()]
        start = time.monotonic()
        proc.send_signal(sig)
        rc = proc.wait(timeout=15)
        assert time.monotonic() - start < 8
        assert rc == 128 + sig
        # The ranks' own children are in the ranks' process groups: gone too.
        assert _wait_gone(pids, 3) == []
        assert f"received {signal.Signals(sig).name}" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in pids:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_host_placement():
    code = ("import os; print(*[os.environ['COLLECTIVES_' + k] for k in "
            "('RANK', 'LOCAL_RANK', 'LOCAL_SIZE')])")
    res = launcher("-H", "localhost:2,127.0.0.1:1", sys.executable, "-c", code)
    assert res.returncode == 0, res.stderr
    seen = sorted(line.split(":", 1)[1] for line in res.stdout.splitlines())
    assert seen == ["0 0 2", "1 1 2", "2 0 1"]


def test_hostfile_run(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost slots=2  # two here\n127.0.0.1:1\n")
    res = launcher("--hostfile", str(hostfile), sys.executable, "-c",
                   "import os; print(os.environ['COLLECTIVES_SIZE'])")
    assert res.returncode == 0, res.stderr
    assert sorted(res.stdout.splitlines()) == [f"[{r}]<stdout>:3" for r in range(3)]


# ------------------------------------------------------------- unit tests

def test_parse_hosts():
    assert run.parse_hosts("a:2,b,c:3") == [("a", 2), ("b", 1), ("c", 3)]
    assert run.parse_hosts("[::1]:4,fd00::2,[fd00::3]") == [
        ("::1", 4), ("fd00::2", 1), ("fd00::3", 1)]
    for bad in ("a:0", "a:x", ":2", "", "[::1"):
        with pytest.raises(ValueError):
            run.parse_hosts(bad)


def test_parse_hostfile(tmp_path):
    path = tmp_path / "hostfile"
    path.write_text(textwrap.dedent("""
        # cluster
        node1 slots=4
        node2:2   # colon form
        node3
        node4 slots=8 max_slots=16

        [fd00::7] slots=2
    """))
    assert run.parse_hostfile(str(path)) == [
        ("node1", 4), ("node2", 2), ("node3", 1), ("node4", 8), ("fd00::7", 2)]
    path.write_text("node1 slots=zero\n")
    with pytest.raises(ValueError, match=":1"):
        run.parse_hostfile(str(path))
    path.write_text("# nothing\n")
    with pytest.raises(ValueError, match="no hosts"):
        run.parse_hostfile(str(path))


def test_is_local_host():
    assert run.is_local_host("localhost")
    assert run.is_local_host("127.0.0.1")
    assert run.is_local_host("[::1]")
    assert run.is_local_host(socket.gethostname())
    assert not run.is_local_host("some-other-node.example")


def test_build_rank_commands_remote_ssh_line():
    cmd = ["python", "train.py", "--name", "it's a test", "$HOME"]
    ranks = run.build_rank_commands(
        cmd, [("localhost", 1), ("node7", 2)], 3, "head:29400",
        exports={"EXTRA": "a b", "COLLECTIVES_IFNAME": "eth0"},
        cwd="/data/my job", ssh_options=["-o", "ConnectTimeout=5"])
    assert [(r.rank, r.host, r.local_rank, r.local_size, r.local) for r in ranks] == [
        (0, "localhost", 0, 1, True), (1, "node7", 0, 2, False), (2, "node7", 1, 2, False)]
    assert ranks[0].argv == cmd
    assert ranks[0].env["COLLECTIVES_RANK"] == "0"
    argv = ranks[2].argv
    assert argv[:6] == ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", "node7"]
    assert len(argv) == 7
    outer = shlex.split(argv[6])  # what the remote login shell sees: sh -c SCRIPT
    assert outer[:2] == ["sh", "-c"] and len(outer) == 3
    lines = outer[2].splitlines()
    assert shlex.split(lines[0]) == ["cd", "/data/my job", "||", "exit", "127"]
    run_line = [ln for ln in lines if ln.startswith("env ")]
    assert len(run_line) == 1
    words = shlex.split(run_line[0])
    assert words[0] == "env" and words[-1] == "&"
    words = words[1:-1]
    assignments = dict(w.split("=", 1) for w in words[:-len(cmd)])
    assert assignments == {
        "EXTRA": "a b", "COLLECTIVES_IFNAME": "eth0", "COLLECTIVES_RANK": "2",
        "COLLECTIVES_SIZE": "3", "COLLECTIVES_LOCAL_RANK": "1",
        "COLLECTIVES_LOCAL_SIZE": "2", "COLLECTIVES_STORE_ADDR": "head:29400",
        "OMP_NUM_THREADS": "1"}  # two ranks share node7, whose cores are unknown here
    assert words[-len(cmd):] == cmd  # quoting survives: no $HOME expansion, quotes kept


def test_build_rank_commands_torchrun_variables():
    ranks = run.build_rank_commands(["x"], [("localhost", 2), ("node7", 1)], 3, "127.0.0.1:1000",
                                    torch_addr="head:2000")
    got = [{k: r.env[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                  "MASTER_ADDR", "MASTER_PORT")} for r in ranks]
    assert got == [
        {"RANK": "0", "WORLD_SIZE": "3", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
         "MASTER_ADDR": "head", "MASTER_PORT": "2000"},
        {"RANK": "1", "WORLD_SIZE": "3", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
         "MASTER_ADDR": "head", "MASTER_PORT": "2000"},
        {"RANK": "2", "WORLD_SIZE": "3", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
         "MASTER_ADDR": "head", "MASTER_PORT": "2000"}]
    # An explicit -x MASTER_PORT=... wins; IPv6 brackets are not part of MASTER_ADDR.
    ranks = run.build_rank_commands(["x"], [("localhost", 1)], 1, "127.0.0.1:1000",
                                    exports={"MASTER_PORT": "29500"}, torch_addr="[::1]:2000")
    assert (ranks[0].env["MASTER_ADDR"], ranks[0].env["MASTER_PORT"]) == ("::1", "29500")
    # The store's own variables stay first: the library reads COLLECTIVES_*.
    assert ranks[0].env["COLLECTIVES_STORE_ADDR"] == "127.0.0.1:1000"


def test_build_rank_commands_share_cores_for_thread_pools(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    ranks = run.build_rank_commands(["x"], [("localhost", 4), ("node7", 1)], 5, "a:1")
    assert [r.env.get("OMP_NUM_THREADS") for r in ranks] == ["2", "2", "2", "2", None]
    ranks = run.build_rank_commands(["x"], [("localhost", 3)], 3, "a:1")
    assert {r.env["OMP_NUM_THREADS"] for r in ranks} == {"2"}  # 8 cores // 3 ranks
    # The user's choice wins: in the environment, or exported with -x.
    ranks = run.build_rank_commands(["x"], [("localhost", 4)], 4, "a:1",
                                    exports={"OMP_NUM_THREADS": "3"})
    assert {r.env["OMP_NUM_THREADS"] for r in ranks} == {"3"}
    monkeypatch.setenv("OMP_NUM_THREADS", "5")
    ranks = run.build_rank_commands(["x"], [("localhost", 4)], 4, "a:1")
    assert all("OMP_NUM_THREADS" not in r.env for r in ranks)  # launch() passes the 5 on


def test_build_rank_commands_checks():
    with pytest.raises(ValueError, match="slots"):
        run.build_rank_commands(["x"], [("a", 1)], 2, "a:1")
    with pytest.raises(ValueError, match="no command"):
        run.build_rank_commands([], [("a", 1)], 1, "a:1")
    ranks = run.build_rank_commands(["x"], [("a", 4), ("b", 4)], 2, "a:1")
    assert [r.host for r in ranks] == ["a", "a"] and ranks[0].local_size == 2


def test_free_port_stays_out_of_the_kernels_ephemeral_range():
    """The store's port is picked where no rank's listener (bound to port 0) can be
    handed it before rank 0 binds it."""
    lo, hi = run._ephemeral_range()
    for pair in (False, True, False):
        port = run.free_port(pair)
        assert not lo <= port <= hi and not lo <= port + int(pair) <= hi, (port, lo, hi)
        for p in range(port, port + 1 + int(pair)):
            with socket.socket() as s:
                s.bind(("", p))  # free
    host, port = run.choose_store_addr([("localhost", 2)]).rsplit(":", 1)
    assert host == "127.0.0.1" and not lo <= int(port) <= hi


def test_choose_store_addr():
    host, port = run.choose_store_addr([("localhost", 2)]).rsplit(":", 1)
    assert host == "127.0.0.1" and 0 < int(port) < 65536
    host, port = run.choose_store_addr([("node1", 2), ("localhost", 1)]).rsplit(":", 1)
    assert host == "node1" and 20000 <= int(port) <= 39999
    host, _ = run.choose_store_addr([("localhost", 1), ("node1", 1)]).rsplit(":", 1)
    assert host == socket.gethostname()
    assert run.choose_store_addr([("fd00::9", 1)]).startswith("[fd00::9]:")


def test_main_in_process(capfd):
    rc = run.main(["-np", "2", sys.executable, "-c", "print('x')"])
    assert rc == 0
    out = capfd.readouterr().out.splitlines()
    assert sorted(out) == ["[0]<stdout>:x", "[1]<stdout>:x"]


# ------------------------------------------------------------ remote ranks

# Stands in for ssh + sshd: runs the remote command line with sh, in a session
# of its own (a remote process is out of reach of the launcher's signals), its
# stdin a pipe that this "client" feeds from its own stdin and that closes
# when the client ends -- as the connection closing ends the remote stdin.
FAKE_SSH = textwrap.dedent("""\
    #!{python}
    import os, signal, subprocess, sys, threading
    with open(os.environ["FAKE_SSH_LOG"], "a") as log:
        log.write(repr(sys.argv[1:]) + "\\n")
    remote = subprocess.Popen(["sh", "-c", sys.argv[-1]], stdin=subprocess.PIPE,
                              start_new_session=True)
    def forward():
        while True:
            data = os.read(0, 4096)
            if not data:
                break
            remote.stdin.write(data)
            remote.stdin.flush()
        remote.stdin.close()  # EOF from the launcher: ssh passes it on
    threading.Thread(target=forward, daemon=True).start()
    signal.signal(signal.SIGTERM, lambda *_: os._exit(255))  # connection drops
    sys.exit(remote.wait())
""")


@pytest.fixture
def fake_ssh(tmp_path, monkeypatch):
    """PATH with the fake ssh first; returns the file it logs its argv to."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    ssh = bindir / "ssh"
    ssh.write_text(FAKE_SSH.format(python=sys.executable))
    ssh.chmod(0o755)
    log = tmp_path / "ssh.log"
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SSH_LOG", str(log))
    return log


def test_remote_script_stops_its_command_when_stdin_closes(tmp_path):
    script = run.remote_script(str(tmp_path), {"MARK": "x y"},
                               [sys.executable, "-c",
                                "import os, time; print(os.getpid(), os.environ['MARK'], "
                                "flush=True); time.sleep(60)"], grace=1)
    proc = subprocess.Popen(["sh", "-c", script], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    pid, mark = proc.stdout.readline().split(" ", 1)
    assert mark.strip() == "x y"
    assert _alive(int(pid))
    proc.stdin.close()
    assert proc.wait(timeout=10) == 128 + signal.SIGTERM  # the command's status
    assert _wait_gone([int(pid)], 2) == []


def test_remote_script_passes_the_exit_status_and_survives_an_open_stdin(tmp_path):
    script = run.remote_script(str(tmp_path), {}, [sys.executable, "-c",
                                                   "import sys; sys.exit(7)"])
    proc = subprocess.Popen(["sh", "-c", script], stdin=subprocess.PIPE)
    assert proc.wait(timeout=10) == 7  # while stdin is still open
    proc.stdin.close()
    assert run.remote_script("/nonexistent-dir", {}, ["true"]).startswith(
        "cd /nonexistent-dir || exit 127")


def test_stopping_a_job_ends_its_remote_ranks(tmp_path, fake_ssh):
    sync = tmp_path / "sync"
    sync.mkdir()
    start = time.monotonic()
    res = launcher("-H", "localhost:1,fakehost:2", "--kill-grace", "2", "-x", f"SYNC_DIR={sync}",
                   sys.executable, "-c", _fail_when_others_ready(0, 2))
    assert res.returncode == 3, res.stderr
    assert time.monotonic() - start < 15
    assert "rank 0 exited with code 3 first; stopped the other 2 ranks" in res.stderr
    assert fake_ssh.read_text().count("fakehost") == 2  # both went through ssh
    pids = [int(line.split(":", 1)[1]) for line in res.stdout.splitlines()]
    assert len(pids) == 2
    assert _wait_gone(pids, 5) == []  # out of the launcher's reach, yet stopped


def test_remote_rank_exit_code_and_output_come_back(fake_ssh):
    res = launcher("-H", "fakehost:1", "sh", "-c", "echo from $COLLECTIVES_RANK; exit 4")
    assert res.returncode == 4, res.stderr
    assert "[0]<stdout>:from 0" in res.stdout


HVD_DUMP = ("import os; print(' '.join(f'{k}={os.environ.get(k)}' for k in ("
            "'HOROVOD_FUSION_THRESHOLD', 'HOROVOD_CYCLE_TIME', 'HOROVOD_CACHE_CAPACITY', "
            "'HOROVOD_TIMELINE', 'HOROVOD_STALL_CHECK_TIME_SECONDS', 'HOROVOD_LOG_LEVEL', "
            "'HOROVOD_AUTOTUNE', 'COLLECTIVES_START_TIMEOUT', 'COLLECTIVES_IFNAME')))")


def test_horovodrun_command_line_runs_after_renaming(tmp_path):
    """horovodrun's common flags: each becomes the variable horovodrun would set; --gloo and
    --mpi are accepted and ignored; -p is the ssh port of remote ranks."""
    res = launcher("-np", "2", "-H", "localhost:2", "-p", "2222", "--start-timeout", "20",
                   "--network-interface", "lo", "--fusion-threshold-mb", "32",
                   "--cycle-time-ms", "2.5", "--cache-capacity", "256",
                   "--timeline-filename", str(tmp_path / "t.json"),
                   "--stall-check-warning-time-seconds", "30", "--log-level", "DEBUG",
                   "--autotune", "--gloo", "--verbose", sys.executable, "-c", HVD_DUMP)
    assert res.returncode == 0, res.stderr
    lines = [ln.split(":", 1)[1] for ln in res.stdout.splitlines() if "<stdout>:" in ln]
    assert len(lines) == 2, res.stdout
    for line in lines:
        got = dict(kv.split("=", 1) for kv in line.split())
        assert got == {"HOROVOD_FUSION_THRESHOLD": str(32 << 20), "HOROVOD_CYCLE_TIME": "2.5",
                       "HOROVOD_CACHE_CAPACITY": "256",
                       "HOROVOD_TIMELINE": str(tmp_path / "t.json"),
                       "HOROVOD_STALL_CHECK_TIME_SECONDS": "30", "HOROVOD_LOG_LEVEL": "debug",
                       "HOROVOD_AUTOTUNE": "1", "COLLECTIVES_START_TIMEOUT": "20",
                       "COLLECTIVES_IFNAME": "lo"}, line
    assert launcher("-np", "1", "--mpi", sys.executable, "-c", "pass").returncode == 0
    bad = launcher("-np", "1", "--cycle-time-ms", "-1", sys.executable, "-c", "pass")
    assert bad.returncode != 0 and "--cycle-time-ms" in bad.stderr
    args = run._parser().parse_args(["-p", "2222", "--start-timeout", "5", "x"])
    from collectives.launcher import horovod_flags

    assert horovod_flags.exports_from(args)[1] == ["-p", "2222"]
