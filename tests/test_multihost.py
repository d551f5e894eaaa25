"""Real multi-host topologies on one machine: network namespaces as hosts (tests/_netns.py).

Each rank runs in its host's network namespace with its host's hostname, so
ranks of one host use shared memory and ranks of different hosts TCP through
tbf-shaped links. One launch per (hosts x ranks, placement) runs a grid of
every collective against exact closed forms: allreduce with every algorithm
(auto picks two_level here), dtype and op, in place and not, allgather(v),
broadcast from several roots, reduce to two roots, reduce-scatter, and a
subcommunicator that gets a topology of its own. Also: a host whose ranks
are all SIGKILLed (every survivor raises within timeout + 2 s naming them
and the host), GPU buffers on the emulated GPU, and torch.distributed.
Needs root: without namespaces these tests fail.
"""
import os
import signal

import pytest

from _netns import Cluster
from conftest import free_port, run_world

pytestmark = pytest.mark.timeout(240)

GRID_BODY = r"""
from collectives import MPI
comm = MPI.COMM_WORLD
core = comm._core
n, r = comm.size, comm.rank
hosts = [int(h) for h in sys.argv[1].split(",")]
emit("host", local_rank=comm.local_rank, local_size=comm.local_size,
     hostname=__import__("socket").gethostname())
OPMAP = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX, "avg": MPI.AVG}
counts = sorted({0, 1, n - 1, n + 1, 4097, 70_001})
cases = 0
for alg in ("auto", "two_level", "ring", "butterfly", "tree"):
    for di, dtype in enumerate(DTYPES):
        esize = np.dtype(np_dtype(dtype)).itemsize
        for oi, op in enumerate(OPS):
            cl = counts if (op == "sum" or alg in ("auto", "two_level")) else [1, n + 1, 4097]
            for count in cl:
                for inplace in ((False, True) if count < 5000 else [(di + oi) % 2 == 1]):
                    case = dict(alg=alg, op=op, dtype=dtype, count=count, inplace=inplace)
                    send = store(rank_values(op, dtype, count, r), dtype)
                    recv = send.copy() if inplace else np.full(count, 0x5A, np_dtype(dtype))
                    if dtype == "bfloat16":
                        guarded(case, core.allreduce, None if inplace else send, recv, op, alg,
                                None, "bfloat16")
                    elif inplace:
                        guarded(case, comm.Allreduce, MPI.IN_PLACE, recv, OPMAP[op], algorithm=alg)
                    else:
                        guarded(case, comm.Allreduce, send, recv, OPMAP[op], algorithm=alg)
                    check(case, recv, expected_stored(op, dtype, count, n), dtype)
                    record_hash(case, recv)
                    cases += 1
# a large one through the pipeline (several segments per slice), both placements of in place
for inplace in (False, True):
    count = (3 << 20) // 4 + 5
    send = (np.arange(count, dtype=np.int64) % 11 + r).astype(np.float32)
    recv = send.copy() if inplace else np.empty(count, np.float32)
    case = dict(what="3 MiB two_level", inplace=inplace)
    guarded(case, comm.Allreduce, MPI.IN_PLACE if inplace else send, recv, MPI.SUM)
    check(case, recv, (n * (np.arange(count) % 11) + n * (n - 1) // 2).astype(np.float32))
    record_hash(case, recv)
    cases += 1
for count in (0, 1, 1000, 300_001):
    case = dict(what="allgather", count=count)
    g = np.empty(count * n, np.int32)
    guarded(case, comm.Allgather, np.full(count, r, np.int32), g)
    check(case, g, np.repeat(np.arange(n, dtype=np.int32), count))
    counts_v = [count + k for k in range(n)]
    gv = np.empty(sum(counts_v), np.int64)
    guarded(case, comm.Allgatherv, np.full(counts_v[r], r, np.int64), [gv, counts_v])
    check(dict(case, what="allgatherv"), gv, np.repeat(np.arange(n, dtype=np.int64), counts_v))
    for root in sorted({0, n - 1, n // 2}):
        b = np.full(count, r, np.float64)
        guarded(dict(case, what="bcast", root=root), comm.Bcast, b, root=root)
        check(dict(case, what="bcast", root=root), b, np.full(count, root, np.float64))
    for root in sorted({0, n - 1}):
        red = np.full(count, -1.0, np.float64)
        guarded(dict(case, what="reduce", root=root), comm.Reduce,
                np.full(count, r + 1, np.float64), red, MPI.SUM, root=root)
        if r == root:
            check(dict(case, what="reduce", root=root), red,
                  np.full(count, n * (n + 1) / 2, np.float64))
    rs = np.empty(count, np.float32)
    guarded(dict(case, what="reduce_scatter"), comm.Reduce_scatter_block,
            np.tile(np.arange(n, dtype=np.float32), (count, 1)).T.copy().ravel() + r, rs)
    check(dict(case, what="reduce_scatter"), rs,
          np.full(count, n * r + n * (n - 1) / 2, np.float32))
    cases += 4
# a subcommunicator (even world ranks) derives its own hosts
sub = comm.Split(r % 2, r)
m = sub.size
for count in (1, 5000, 200_001):
    x = np.full(count, r + 1, np.float64)
    case = dict(what="sub allreduce", count=count)
    guarded(case, sub.Allreduce, MPI.IN_PLACE, x)
    members = [q for q in range(n) if q % 2 == r % 2]
    check(case, x, np.full(count, sum(q + 1 for q in members), np.float64))
sub.Free()
verify_hashes(comm)
emit("cases", count=cases)
"""

# (hosts x ranks per host, or per-host counts), placement, encrypted. Each shape runs in
# one placement, and together they cover 2, 3 and 4 hosts, 2, 3 and 4 ranks per host,
# uneven hosts, block and cyclic (every shape in both placements is checked without
# namespaces, in tests/test_topology.py's schedule simulator, which counts every host
# link's bytes). The 2- and 3-host shapes run with COLLECTIVES_ENCRYPT=1: the links between
# hosts sealed in AES-256-GCM, those inside a host shared memory (issue 37, section 3).
SHAPES = [
    ([2, 2], "block", True), ([4, 4], "cyclic", False), ([2, 2, 2], "cyclic", True),
    ([2, 2, 2, 2], "block", False), ([2, 3], "cyclic", False),
]


def _placement(sizes, placement):
    if placement == "block":
        return [h for h, k in enumerate(sizes) for _ in range(k)]
    left, out = list(sizes), []
    while any(left):
        for h in range(len(left)):
            if left[h]:
                out.append(h)
                left[h] -= 1
    return out


@pytest.mark.parametrize("sizes,placement,encrypt", SHAPES,
                         ids=[f"{'+'.join(map(str, s))}-{p}{'-encrypted' if e else ''}"
                              for s, p, e in SHAPES])
def test_every_collective_on_a_namespace_cluster(sizes, placement, encrypt):
    n = sum(sizes)
    env = {"COLLECTIVES_DEBUG": "INFO", "COLLECTIVES_DEBUG_SUBSYS": "TUNE,NET"}
    if encrypt:
        env.update(COLLECTIVES_ENCRYPT="1", COLLECTIVES_JOB_SECRET="multihost-" + "ab" * 16)
    with Cluster(len(sizes), rate="4gbit") as c:
        hosts = c.hosts_of(n, _placement(sizes, placement))
        res = run_world(n, GRID_BODY, args=[",".join(map(str, hosts))], timeout=220,
                        rank_env=c.rank_env(free_port()), prefix=c.prefix, env=env)
    assert not c.exists(), "the cluster's namespaces outlived it"
    res.assert_ok()
    for r in range(n):
        h = res[r].one("host")
        assert h["hostname"] == c.hostname(hosts[r]), res.report()
        assert h["local_size"] == hosts.count(hosts[r])
        assert h["local_rank"] == [q for q in range(n) if hosts[q] == hosts[r]].index(r)
        assert res[r].one("cases")["count"] > 500
        # each link says how it goes: shared memory inside a host, TCP between hosts,
        # sealed in AES-256-GCM exactly when the job encrypts
        links = [l for l in res[r].stderr.splitlines() if "<-> rank" in l]
        assert links, res[r].stderr[-2000:]
        for line in links:
            if "via shm" in line:
                assert "AES" not in line, line
            else:
                assert ("AES-256-GCM" in line) == encrypt, line
    # auto chose two levels, and said so (COLLECTIVES_DEBUG=INFO)
    assert "two_level" in res[0].stderr, res[0].stderr[-2000:]


DEATH_BODY = r"""
import signal
from collectives import MPI
comm = MPI.COMM_WORLD
n, r = comm.size, comm.rank
hosts = [int(h) for h in sys.argv[1].split(",")]
doomed = [q for q in range(n) if hosts[q] == 1]
x = np.ones(1 << 20, np.float32)
comm.Allreduce(MPI.IN_PLACE, x)  # every link up
open(os.path.join(os.environ["WORLD_DIR"], f"pid{r}"), "w").write(str(os.getpid()))
arrive(f"ready{r}")
if r in doomed:
    assert wait_for(*[f"ready{q}" for q in range(n)])
    if r == doomed[0]:  # the whole host at once
        pids = [int(open(os.path.join(os.environ["WORLD_DIR"], f"pid{q}")).read()) for q in doomed]
        for p in pids:
            if p != os.getpid():
                os.kill(p, signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)
t0 = time.monotonic()
try:
    for k in range(1000):
        comm.Allreduce(MPI.IN_PLACE, x)
    emit("no_error")
except Exception as exc:
    emit("raised", seconds=time.monotonic() - t0, message=str(exc), type=type(exc).__name__)
"""


@pytest.mark.parametrize("placement", ["block", "cyclic"])
def test_a_dead_host_makes_every_survivor_raise_naming_its_ranks(placement):
    sizes = [2, 2, 2]
    n = sum(sizes)
    timeout = 5.0
    with Cluster(3, rate="4gbit") as c:
        hosts = c.hosts_of(n, _placement(sizes, placement))
        res = run_world(n, DEATH_BODY, args=[",".join(map(str, hosts))], timeout=60,
                        collective_timeout=timeout, rank_env=c.rank_env(free_port()),
                        prefix=c.prefix)
    assert not c.exists()
    doomed = [q for q in range(n) if hosts[q] == 1]
    for q in doomed:
        assert res[q].returncode == -signal.SIGKILL, res.report()
    for q in range(n):
        if q in doomed:
            continue
        rec = res[q].one("raised")
        assert rec["seconds"] < timeout + 2, (q, rec)
        for d in doomed:
            assert str(d) in rec["message"], (q, d, rec["message"])
        assert c.hostname(1) in rec["message"], (q, rec["message"])


GPU_BODY = r"""
from collectives import MPI, _core
comm = MPI.COMM_WORLD
core = comm._core
n, r = comm.size, comm.rank
for count in (1, 4097, 300_001):
    host = (np.arange(count) % 13 + r).astype(np.float32)
    want = (n * (np.arange(count) % 13) + n * (n - 1) // 2).astype(np.float32)
    for alg in ("auto", "two_level"):
        for inplace in (True, False):
            case = dict(what="device allreduce", count=count, alg=alg, inplace=inplace)
            src = _core.DeviceBuffer(count * 4, "float32", 0)
            src.copy_from(host)
            dst = src if inplace else _core.DeviceBuffer(count * 4, "float32", 0)
            guarded(case, core.allreduce, None if inplace else src, dst, "sum", alg, None,
                    "float32")
            got = np.empty(count, np.float32)
            dst.copy_to(got)
            check(case, got, want)
    g = _core.DeviceBuffer(count * 4 * n, "float32", 0)
    src = _core.DeviceBuffer(count * 4, "float32", 0)
    src.copy_from(np.full(count, r, np.float32))
    guarded(dict(what="device allgather", count=count), comm.Allgather, src, g)
    got = np.empty(count * n, np.float32)
    g.copy_to(got)
    check(dict(what="device allgather", count=count), got,
          np.repeat(np.arange(n, dtype=np.float32), count))
emit("gpu_cases")
"""


def test_device_buffers_go_two_level_on_the_emulated_gpu():
    """GPU buffers through the device executor (COLLECTIVES_CUDA_FAKE=1: a GPU
    emulated in host memory): CUDA IPC between same-host ranks, staging to the
    others, with the two-level schedules."""
    sizes = [2, 2]
    with Cluster(2, rate="4gbit") as c:
        hosts = c.hosts_of(4, _placement(sizes, "cyclic"))
        res = run_world(4, GPU_BODY, timeout=200, rank_env=c.rank_env(free_port()),
                        prefix=c.prefix, env={"COLLECTIVES_CUDA_FAKE": "1"})
    res.assert_ok()
    for r in range(4):
        res[r].one("gpu_cases")


TORCH_BODY = r"""
import torch
import torch.distributed as dist
import collectives.torch  # registers the "collectives" backend
dist.init_process_group("collectives", init_method=f"tcp://{os.environ['MASTER_ADDR']}:"
                        f"{os.environ['MASTER_PORT']}", rank=RANK, world_size=int(os.environ["COLLECTIVES_SIZE"]))
n, r = dist.get_world_size(), dist.get_rank()
for count in (1, 1000, 300_001):
    t = torch.arange(count, dtype=torch.float32) % 17 + r
    dist.all_reduce(t)
    check(dict(what="all_reduce", count=count), t.numpy(),
          ((np.arange(count) % 17) * n + n * (n - 1) // 2).astype(np.float32))
    parts = [torch.empty(count) for _ in range(n)]
    dist.all_gather(parts, torch.full((count,), float(r)))
    check(dict(what="all_gather", count=count), torch.cat(parts).numpy(),
          np.repeat(np.arange(n, dtype=np.float32), count))
    out = torch.empty(count)
    dist.reduce_scatter_tensor(out, torch.arange(n, dtype=torch.float32).repeat_interleave(count) + r)
    check(dict(what="reduce_scatter", count=count), out.numpy(),
          np.full(count, n * r + n * (n - 1) / 2, np.float32))
evens = dist.new_group([q for q in range(n) if q % 2 == 0])
if r % 2 == 0:
    t = torch.full((50_000,), 1.0)
    dist.all_reduce(t, group=evens)
    check(dict(what="subgroup all_reduce"), t.numpy(), np.full(50_000, (n + 1) // 2, np.float32))
dist.destroy_process_group()
emit("torch_cases")
"""


def test_torch_distributed_takes_the_two_level_path():
    """The torch.distributed backend rides on auto: two levels, and its groups get their own hosts."""
    pytest.importorskip("torch")
    with Cluster(2, rate="4gbit") as c:
        hosts = c.hosts_of(8, [0, 1, 0, 1, 1, 0, 1, 0])  # 4 + 4, a random-looking placement
        res = run_world(8, TORCH_BODY, timeout=200, rank_env=c.rank_env(free_port()),
                        prefix=c.prefix,
                        env={"COLLECTIVES_DEBUG": "INFO", "COLLECTIVES_DEBUG_SUBSYS": "TUNE"})
    res.assert_ok()
    for r in range(8):
        res[r].one("torch_cases")
    for kind in ("allreduce", "allgatherv", "reduce_scatter"):
        assert any(f"{kind} #" in line and "two_level" in line
                   for line in res[0].stderr.splitlines()), (kind, res[0].stderr[-3000:])
