"""Tests of collectives.rendezvous.env: sources and their precedence, addresses, interfaces."""

import re
import socket

import pytest

from collectives.rendezvous import env as _env
from collectives import config
from collectives.rendezvous.env import (WorldInfo, advertise_address, derived_port, detect,
                                        expand_hostlist, format_addr, interface_address,
                                        parse_addr)

pytestmark = pytest.mark.timeout(60)

OURS = {
    "COLLECTIVES_RANK": "1", "COLLECTIVES_SIZE": "4", "COLLECTIVES_LOCAL_RANK": "1",
    "COLLECTIVES_LOCAL_SIZE": "2", "COLLECTIVES_STORE_ADDR": "10.0.0.1:29400",
}
# As torchrun sets them (torch 2.13's agent, checked in tests/test_engines.py).
TORCHRUN = {
    "RANK": "2", "WORLD_SIZE": "8", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "4",
    "MASTER_ADDR": "master", "MASTER_PORT": "29500", "GROUP_RANK": "0",
    "TORCHELASTIC_RUN_ID": "none", "TORCHELASTIC_USE_AGENT_STORE": "True",
}
# mpirun with every rank on this host (local size = size).
OMPI = {
    "OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "6",
    "OMPI_COMM_WORLD_LOCAL_RANK": "3", "OMPI_COMM_WORLD_LOCAL_SIZE": "6",
    "OMPI_MCA_ess_base_jobid": "1234567",
}
# A task of `srun -n 8` in job 98765 (step 0), as srun sets its variables.
SLURM = {
    "SLURM_JOB_ID": "98765", "SLURM_JOB_NODELIST": "gpu[07-08]", "SLURM_NTASKS": "8",
    "SLURM_TASKS_PER_NODE": "4(x2)", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "8",
    "SLURM_STEP_NODELIST": "gpu[07-08]", "SLURM_STEP_TASKS_PER_NODE": "4(x2)",
    "SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
}


def test_single_process_when_nothing_is_set():
    assert detect({}) == WorldInfo(0, 1, 0, 1, None, None, "single")


def test_collectives_variables():
    assert detect(OURS) == WorldInfo(1, 4, 1, 2, "10.0.0.1", 29400, "collectives")


def test_torchrun_uses_master_port_plus_one():
    assert detect(TORCHRUN) == WorldInfo(2, 8, 2, 4, "master", 29501, "torchrun")


def test_openmpi_on_one_host_defaults_to_loopback_and_jobid_port():
    info = detect(OMPI)
    assert info == WorldInfo(3, 6, 3, 6, "127.0.0.1", derived_port("1234567"), "openmpi")
    assert 20000 <= info.store_port <= 39999


@pytest.mark.parametrize("jobvar", ["OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE",
                                    "OMPI_MCA_orte_ess_jobid"])
def test_openmpi_job_id_variables(jobvar):
    env = {k: v for k, v in OMPI.items() if k != "OMPI_MCA_ess_base_jobid"}
    env[jobvar] = "job-42"
    assert detect(env).store_port == derived_port("job-42")


def test_openmpi_master_addr_wins_over_jobid():
    info = detect({**OMPI, "MASTER_ADDR": "head", "MASTER_PORT": "4000"})
    assert (info.store_host, info.store_port) == ("head", 4000)


def test_openmpi_without_any_store_address_raises():
    env = {k: v for k, v in OMPI.items() if k != "OMPI_MCA_ess_base_jobid"}
    with pytest.raises(ValueError, match="COLLECTIVES_STORE_ADDR"):
        detect(env)


def test_slurm():
    info = detect(SLURM)
    assert info == WorldInfo(5, 8, 1, 4, "gpu07", derived_port("98765"), "slurm")


def test_slurm_uneven_tasks_per_node_gives_no_local_size():
    info = detect({**SLURM, "SLURM_STEP_TASKS_PER_NODE": "3(x2),2"})
    assert info.local_size is None and info.local_rank == 1


def test_slurm_master_addr():
    info = detect({**SLURM, "MASTER_ADDR": "head", "MASTER_PORT": "4000"})
    assert (info.store_host, info.store_port) == ("head", 4000)


def test_precedence_collectives_over_everything():
    assert detect({**SLURM, **OMPI, **TORCHRUN, **OURS}).source == "collectives"


def test_precedence_torchrun_over_mpi_and_slurm():
    assert detect({**SLURM, **OMPI, **TORCHRUN}).source == "torchrun"


def test_precedence_openmpi_over_slurm():
    assert detect({**SLURM, **OMPI}).source == "openmpi"


@pytest.mark.parametrize("base", [TORCHRUN, OMPI, SLURM])
def test_store_addr_overrides_every_source(base):
    info = detect({**base, "COLLECTIVES_STORE_ADDR": "[fd00::5]:7000"})
    assert (info.store_host, info.store_port) == ("fd00::5", 7000)


def test_local_variables_are_optional():
    info = detect({"COLLECTIVES_RANK": "0", "COLLECTIVES_SIZE": "2",
                   "COLLECTIVES_STORE_ADDR": "h:1"})
    assert info.local_rank is None and info.local_size is None


@pytest.mark.parametrize("env,var", [
    ({**OURS, "COLLECTIVES_RANK": "x"}, "COLLECTIVES_RANK"),
    ({**OURS, "COLLECTIVES_SIZE": "four"}, "COLLECTIVES_SIZE"),
    ({**OURS, "COLLECTIVES_RANK": "4"}, "COLLECTIVES_RANK"),
    ({**OURS, "COLLECTIVES_RANK": "-1"}, "COLLECTIVES_RANK"),
    ({**OURS, "COLLECTIVES_SIZE": "0"}, "COLLECTIVES_SIZE"),
    ({**OURS, "COLLECTIVES_LOCAL_RANK": "2"}, "COLLECTIVES_LOCAL_RANK"),
    ({**OURS, "COLLECTIVES_LOCAL_SIZE": "z"}, "COLLECTIVES_LOCAL_SIZE"),
    ({**OURS, "COLLECTIVES_STORE_ADDR": "nohost"}, "COLLECTIVES_STORE_ADDR"),
    ({**OURS, "COLLECTIVES_STORE_ADDR": "h:99999"}, "COLLECTIVES_STORE_ADDR"),
    ({k: v for k, v in OURS.items() if k != "COLLECTIVES_STORE_ADDR"},
     "COLLECTIVES_STORE_ADDR"),
    ({k: v for k, v in OURS.items() if k != "COLLECTIVES_SIZE"}, "COLLECTIVES_SIZE"),
    ({**TORCHRUN, "RANK": "8"}, "RANK"),
    ({**TORCHRUN, "WORLD_SIZE": "1.5"}, "WORLD_SIZE"),
    ({**TORCHRUN, "LOCAL_RANK": "?"}, "LOCAL_RANK"),
    ({**TORCHRUN, "LOCAL_WORLD_SIZE": "?"}, "LOCAL_WORLD_SIZE"),
    ({**TORCHRUN, "MASTER_PORT": "http"}, "MASTER_PORT"),
    ({**TORCHRUN, "MASTER_PORT": "65535"}, "MASTER_PORT"),
    ({k: v for k, v in TORCHRUN.items() if k != "MASTER_ADDR"}, "MASTER_ADDR"),
    ({**OMPI, "OMPI_COMM_WORLD_RANK": "6"}, "OMPI_COMM_WORLD_RANK"),
    ({**OMPI, "OMPI_COMM_WORLD_SIZE": ""}, "OMPI_COMM_WORLD_SIZE"),
    ({**OMPI, "OMPI_COMM_WORLD_LOCAL_RANK": "6"}, "OMPI_COMM_WORLD_LOCAL_RANK"),
    ({**SLURM, "SLURM_PROCID": "8"}, "SLURM_PROCID"),
    ({**SLURM, "SLURM_STEP_NUM_TASKS": "n"}, "SLURM_STEP_NUM_TASKS"),
    ({**SLURM, "SLURM_LOCALID": "l"}, "SLURM_LOCALID"),
    ({**SLURM, "SLURM_STEP_NODELIST": "gpu[07-"}, "SLURM_STEP_NODELIST"),
    ({k: v for k, v in SLURM.items() if k != "SLURM_JOB_ID"}, "SLURM_JOB_ID"),
])
def test_bad_values_name_the_variable(env, var):
    with pytest.raises(ValueError, match=var.replace("/", ".")):
        detect(env)


def test_detect_reads_os_environ_by_default(monkeypatch):
    for name in list(OURS) + list(TORCHRUN) + list(OMPI) + list(SLURM):
        monkeypatch.delenv(name, raising=False)
    for key, value in OURS.items():
        monkeypatch.setenv(key, value)
    assert detect().rank == 1


# ------------------------------------------------------------- hostlists

@pytest.mark.parametrize("text,hosts", [
    ("node1", ["node1"]),
    ("node[01-04,07],gpu3", ["node01", "node02", "node03", "node04", "node07", "gpu3"]),
    ("a,b,c", ["a", "b", "c"]),
    ("n[8-11]", ["n8", "n9", "n10", "n11"]),
    ("n[098-101]", ["n098", "n099", "n100", "n101"]),
    ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
    ("gpu[3]-ib", ["gpu3-ib"]),
    ("x[1,3],y[2-3]", ["x1", "x3", "y2", "y3"]),
])
def test_expand_hostlist(text, hosts):
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize("text", ["n[1-", "n]1[", "n[a-b]", "n[3-1]", "n[1-2"])
def test_expand_hostlist_rejects_garbage(text):
    with pytest.raises(ValueError):
        expand_hostlist(text)


# ------------------------------------------------------------- addresses

@pytest.mark.parametrize("text,addr", [
    ("127.0.0.1:80", ("127.0.0.1", 80)),
    ("head-node.cluster:29500", ("head-node.cluster", 29500)),
    ("[::1]:5000", ("::1", 5000)),
    ("[fe80::1%eth0]:5000", ("fe80::1%eth0", 5000)),
    (" host:1 ", ("host", 1)),
])
def test_parse_addr(text, addr):
    assert parse_addr(text) == addr


@pytest.mark.parametrize("text", ["host", "::1:5000", "[::1]5000", "[::1", ":80",
                                  "host:0", "host:65536", "host:x", "[::1]:"])
def test_parse_addr_rejects(text):
    with pytest.raises(ValueError):
        parse_addr(text)


@pytest.mark.parametrize("host,port,text", [
    ("127.0.0.1", 80, "127.0.0.1:80"), ("::1", 5000, "[::1]:5000"),
    ("fd00::2", 1, "[fd00::2]:1"), ("node", 2, "node:2"),
])
def test_format_addr_round_trips(host, port, text):
    assert format_addr(host, port) == text
    assert parse_addr(text) == (host, port)


def test_derived_port_is_stable_and_in_range():
    ports = {derived_port(str(job)) for job in range(1000)}
    assert all(20000 <= p <= 39999 for p in ports)
    assert len(ports) > 900
    assert derived_port("abc") == derived_port("abc")


# ------------------------------------------------------------ interfaces

def test_interface_address_lo():
    assert interface_address("lo") == "127.0.0.1"
    assert interface_address("lo", socket.AF_INET) == "127.0.0.1"


def test_interface_address_lo_ipv6():
    try:
        addr = interface_address("lo", socket.AF_INET6)
    except ValueError:
        pytest.skip("no IPv6 on lo")
    assert addr == "::1"


def test_interface_address_unknown_lists_known():
    with pytest.raises(ValueError, match="unknown network interface 'nope0'.*lo"):
        interface_address("nope0")


def test_ipv6_link_local_only_when_nothing_else(monkeypatch, tmp_path):
    table = tmp_path / "if_inet6"
    table.write_text(
        "fe800000000000000000000000000001 02 40 20 80 eth9\n"
        "fd000000000000000000000000000009 02 40 00 80 eth9\n"
        "fe800000000000000000000000000002 03 40 20 80 eth8\n")
    real_open = open
    monkeypatch.setattr(_env, "open", lambda path, *a, **k: real_open(
        table if path == "/proc/net/if_inet6" else path, *a, **k), raising=False)
    assert _env._ipv6_of("eth9") == "fd00::9"
    assert _env._ipv6_of("eth8") == "fe80::2%eth8"
    assert _env._ipv6_of("eth7") is None


def test_advertise_address():
    assert advertise_address("127.0.0.1", 1234, environ={}) == "127.0.0.1"
    assert advertise_address(None, None, environ={}) == "127.0.0.1"
    assert advertise_address("127.0.0.1", 1234, "lo", environ={}) == "127.0.0.1"
    assert advertise_address("127.0.0.1", 1234,
                             environ={"COLLECTIVES_IFNAME": "lo"}) == "127.0.0.1"
    with pytest.raises(ValueError, match="nope0"):
        advertise_address("127.0.0.1", 1234, environ={"COLLECTIVES_IFNAME": "nope0"})


def test_advertise_address_ipv6_store():
    if not socket.has_ipv6:
        pytest.skip("no IPv6")
    assert advertise_address("::1", 1234, environ={}) == "::1"


def test_advertise_address_unresolvable_store_falls_back():
    assert advertise_address("no-such-host.invalid", 1, environ={}) == "127.0.0.1"


@pytest.mark.parametrize("text,value", [("65536", 65536), ("4M", 4 << 20), ("512k", 512 << 10),
                                        ("4MiB", 4 << 20), ("1G", 1 << 30), ("0", 0),
                                        ("8b", 8), (" 2M ", 2 << 20)])
def test_byte_size_reads_what_the_core_reads(text, value):
    assert _env.byte_size("COLLECTIVES_SEGMENT_BYTES", text) == value


@pytest.mark.parametrize("name,text", [("COLLECTIVES_SEGMENT_BYTES", "4 M"),
                                       ("COLLECTIVES_SOCKET_BUFFER", "-1"),
                                       ("COLLECTIVES_SHM_BYTES", "big"),
                                       ("COLLECTIVES_FUSION_THRESHOLD", "1.5M"),
                                       ("COLLECTIVES_CUDA_SEGMENT_BYTES", "4T")])
def test_size_variables_the_core_would_misread_are_refused(name, text):
    with pytest.raises(ValueError, match=f"{name}='{re.escape(text)}' is not a number of bytes"):
        config.check_env({name: text})


def test_size_variables_accept_auto_only_where_the_core_has_one():
    config.check_env({"COLLECTIVES_SOCKET_BUFFER": "auto", "COLLECTIVES_SEGMENT_BYTES": "AUTO"})
    with pytest.raises(ValueError, match="COLLECTIVES_SHM_BYTES='auto'"):
        config.check_env({"COLLECTIVES_SHM_BYTES": "auto"})


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name,text,message", [
    ("COLLECTIVES_SEGMENT_BYTES", "4 M", "is not a number of bytes"),
    ("COLLECTIVES_BIND", "socket", "is not one of auto, core, none"),
    ("COLLECTIVES_SPIN_US", "fast", "is not a number of microseconds"),
])
def test_init_refuses_a_misread_setting_before_the_rendezvous(name, text, message):
    """A bad size or host policy fails collectives.init() at once, naming the variable (no
    store is up: the rank never gets as far as connecting to one)."""
    import subprocess
    import sys

    from conftest import base_env, free_port

    env = base_env({"COLLECTIVES_RANK": "1", "COLLECTIVES_SIZE": "2",
                    "COLLECTIVES_STORE_ADDR": f"127.0.0.1:{free_port()}",
                    name: text, "COLLECTIVES_TIMEOUT": "30"})
    res = subprocess.run([sys.executable, "-c", "import collectives; collectives.init()"],
                         env=env, capture_output=True, text=True, timeout=50)
    assert res.returncode != 0
    assert f"ValueError: {name}='{text}' {message}" in res.stderr, res.stderr
