"""Every COLLECTIVES_* variable is checked the same way, from its one declaration.

native/param.c declares each tunable's allowed values; collectives.config
turns that text into a check that init() and collectives-run apply before any
connection, raising ValueError with the variable's name and what it allows.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from collectives import config


def _allowed(name: str) -> str:
    return next(a for n, _, _, a in config.params() if n == name)


def test_every_declaration_has_a_readable_rule_that_its_default_meets() -> None:
    decls = config.params()
    assert len(decls) >= 24 and all(len(d) == 4 for d in decls)
    for name, default, desc, allowed in decls:
        assert allowed, f"{name} declares no allowed values"
        check = config.checker(allowed)  # raises for text outside the grammar
        if default and not default.startswith("~"):
            check(name, default)


def test_a_rule_outside_the_grammar_is_refused() -> None:
    with pytest.raises(ValueError, match="cannot read the allowed values"):
        config.checker("anything goes")


@pytest.mark.parametrize("name,text", [
    ("COLLECTIVES_TRANSPORT", "infiniband"),
    ("COLLECTIVES_DEBUG", "verbose"),
    ("COLLECTIVES_DEBUG_SUBSYS", "INIT,FOO"),
    ("COLLECTIVES_ALGO", "rign"),
    ("COLLECTIVES_BIND", "socket"),
    ("COLLECTIVES_CUDA_IPC", "yes"),
    ("COLLECTIVES_SHM_BYTES", "3M"),         # not a power of two
    ("COLLECTIVES_SHM_BYTES", "32K"),        # below the core's smallest ring
    ("COLLECTIVES_SHM_BYTES", "2G"),         # above its largest
    ("COLLECTIVES_SEGMENT_BYTES", "0"),
    ("COLLECTIVES_SEGMENT_BYTES", "4 M"),
    ("COLLECTIVES_CUDA_SEGMENT_BYTES", "1.5M"),
    ("COLLECTIVES_TIMEOUT", "0"),
    ("COLLECTIVES_TIMEOUT", "-5"),
    ("COLLECTIVES_TIMEOUT", "inf"),
    ("COLLECTIVES_TIMEOUT", "nan"),
    ("COLLECTIVES_TIMEOUT", "abc"),
    ("COLLECTIVES_START_TIMEOUT", "0"),
    ("COLLECTIVES_SPIN_US", "-1"),
    ("COLLECTIVES_STORE_ADDR", "nohost"),
    ("COLLECTIVES_SIZE", "0"),
])
def test_a_value_outside_the_declaration_names_the_variable(name, text) -> None:
    with pytest.raises(ValueError) as info:
        config.check_env({name: text})
    message = str(info.value)
    assert message.startswith(name), message
    if name != "COLLECTIVES_STORE_ADDR":  # parse_addr says what an address looks like
        allowed = _allowed(name)
        items = allowed.split(": ", 1)[-1].split(", ")
        assert allowed in message or all(i in message for i in items), message


@pytest.mark.parametrize("name,text", [
    ("COLLECTIVES_TRANSPORT", "TCP"), ("COLLECTIVES_TRANSPORT", "shm"),
    ("COLLECTIVES_DEBUG", "info"), ("COLLECTIVES_DEBUG", "TRACE"),
    ("COLLECTIVES_DEBUG_SUBSYS", "init,NET"), ("COLLECTIVES_ALGO", "auto"),
    ("COLLECTIVES_SHM_BYTES", "1M"), ("COLLECTIVES_SHM_BYTES", "64K"),
    ("COLLECTIVES_SHM_BYTES", "1G"), ("COLLECTIVES_SEGMENT_BYTES", "AUTO"),
    ("COLLECTIVES_SOCKET_BUFFER", "0"), ("COLLECTIVES_FUSION_THRESHOLD", "0"),
    ("COLLECTIVES_TIMEOUT", "0.5"), ("COLLECTIVES_SPIN_US", "0"),
    ("COLLECTIVES_SPIN_US", "auto"), ("COLLECTIVES_STORE_ADDR", "[::1]:29500"),
    ("COLLECTIVES_TUNE_FILE", "/no/such/file"), ("COLLECTIVES_TIMEOUT", ""),
])
def test_values_the_core_reads_pass(name, text) -> None:
    config.check_env({name: text})


def _env(extra: dict) -> dict:
    from conftest import base_env
    return base_env(extra)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name,text", [("COLLECTIVES_TRANSPORT", "infiniband"),
                                       ("COLLECTIVES_TIMEOUT", "0")])
def test_init_refuses_before_the_rendezvous(name, text) -> None:
    """Rank 1 of 2 with no store up: without the check it would wait for the store."""
    from conftest import free_port

    env = _env({"COLLECTIVES_RANK": "1", "COLLECTIVES_SIZE": "2",
                "COLLECTIVES_STORE_ADDR": f"127.0.0.1:{free_port()}",
                "COLLECTIVES_START_TIMEOUT": "30", name: text})
    res = subprocess.run([sys.executable, "-c", "import collectives; collectives.init()"],
                         env=env, capture_output=True, text=True, timeout=50)
    assert res.returncode != 0
    assert f"ValueError: {name}='{text}'" in res.stderr, res.stderr
    assert _allowed(name).split(": ")[-1].split(", ")[0] in res.stderr.splitlines()[-1]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("args,env,needle", [
    (["--timeout", "-5"], {}, "--timeout: '-5': must be a number of seconds > 0"),
    (["--timeout", "0"], {}, "--timeout: '0': must be a number of seconds > 0"),
    (["--start-timeout", "0"], {}, "--start-timeout: '0': must be a number of seconds > 0"),
    ([], {"COLLECTIVES_DEBUG": "verbose"}, "COLLECTIVES_DEBUG='verbose' is not one of NONE"),
    (["-x", "COLLECTIVES_SHM_BYTES=3M"], {}, "COLLECTIVES_SHM_BYTES='3M' (3145728 bytes) is "
                                             "not allowed: power-of-two bytes"),
])
def test_launcher_refuses_before_starting_any_rank(tmp_path, args, env, needle) -> None:
    marker = tmp_path / "started"
    cmd = [sys.executable, "-m", "collectives.run", "-np", "2", *args,
           sys.executable, "-c", f"open({str(marker)!r}, 'a').write('x')"]
    from conftest import RUN_CWD
    res = subprocess.run(cmd, env=_env(env), capture_output=True, text=True, timeout=50,
                         cwd=RUN_CWD)
    assert res.returncode == 2, (res.returncode, res.stderr)
    assert needle in res.stderr, res.stderr
    assert not marker.exists(), "a rank was started"


def test_every_variable_the_package_reads_is_declared() -> None:
    """A COLLECTIVES_* name in the package's source is declared (core or OTHER_VARS):
    else the misspelling warning would fire on a variable that is read."""
    import pathlib
    import re

    root = pathlib.Path(config.__file__).resolve().parent
    names = set()
    for path in root.rglob("*.py"):
        names |= set(re.findall(r"\b(COLLECTIVES_[A-Z0-9_]*[A-Z0-9])\b", path.read_text()))
    declared = {n for n, _, _, _ in config.params()} | set(config.OTHER_VARS)
    assert not sorted(names - declared), "read but not declared"


def test_unknown_vars_names_the_closest() -> None:
    env = {"COLLECTIVES_TIMEOUTS": "5", "COLLECTIVES_TIMEOUT": "5", "COLLECTIVES_IFNAM": "lo",
           "COLLECTIVES_ZZZ_QQQ": "1", "HOME": "/"}
    assert config.unknown_vars(env) == [("COLLECTIVES_IFNAM", "COLLECTIVES_IFNAME"),
                                        ("COLLECTIVES_TIMEOUTS", "COLLECTIVES_TIMEOUT"),
                                        ("COLLECTIVES_ZZZ_QQQ", None)]


@pytest.mark.timeout(60)
def test_a_misspelled_variable_is_warned_once_per_job() -> None:
    """Issue 38 item 7: COLLECTIVES_TIMEOUTS=5 is warned about once (rank 0), naming
    COLLECTIVES_TIMEOUT, and the job runs."""
    from conftest import run_world

    body = ("from collectives import MPI\nc = MPI.COMM_WORLD\nc.Barrier()\n"
            "import collectives; collectives.finalize(); collectives.init().Barrier()\n"
            "emit('done')\n")
    res = run_world(2, body, timeout=40, env={"COLLECTIVES_TIMEOUTS": "5"}).assert_ok()
    warned = [res[r].stderr.count("COLLECTIVES_TIMEOUTS is set but is not a variable "
                                  "collectives reads: ignored; did you mean COLLECTIVES_TIMEOUT?")
              for r in range(2)]
    assert warned == [1, 0], res.report()
