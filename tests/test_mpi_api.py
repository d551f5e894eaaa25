"""collectives.MPI behaves like the mpi4py subset it claims: names, specs, object
collectives, errors raised before any byte is sent, and an mpi4py script that runs
unchanged under collectives-run and under torchrun/OpenMPI/Slurm environments."""
import pytest

from conftest import TESTS, free_port, run_world

pytestmark = pytest.mark.timeout(90)

SCRIPT = str(TESTS / "data" / "mpi4py_train.py")


def test_names_exist():
    from collectives import MPI

    for name in ("COMM_WORLD", "Comm", "Request", "Op", "Datatype", "Exception", "IN_PLACE",
                 "SUM", "PROD", "MIN", "MAX", "AVG", "Wtime", "Wtick", "Get_processor_name",
                 "Init", "Finalize", "Is_initialized", "Is_finalized", "INT", "FLOAT", "DOUBLE",
                 "BYTE", "CHAR", "LONG", "INT64_T"):
        assert name in dir(MPI) or name == "COMM_WORLD", name
    for meth in ("Get_rank", "Get_size", "Allreduce", "Iallreduce", "Bcast", "Allgather",
                 "Allgatherv", "Reduce_scatter_block", "Barrier", "bcast", "allgather",
                 "allreduce", "gather", "scatter", "Abort", "Free"):
        assert callable(getattr(MPI.Comm, meth)), meth
    for prop in ("rank", "size", "local_rank", "local_size"):
        assert isinstance(getattr(MPI.Comm, prop), property), prop
    assert issubclass(MPI.Exception, RuntimeError)
    e = MPI.Exception(5, "boom")
    assert e.Get_error_code() == 5 and e.Get_error_class() == 5 and "boom" in e.Get_error_string()
    assert isinstance(MPI.Wtime(), float) and 0 < MPI.Wtick() < 1
    assert MPI.Wtime() <= MPI.Wtime()
    assert MPI.Comm() == MPI.COMM_NULL and MPI.Comm() is not MPI.COMM_NULL  # mpi4py's null
    with pytest.raises(TypeError):
        MPI.Comm((1, 2, 3))
    with pytest.raises(AttributeError):
        MPI.NO_SUCH_NAME  # noqa: B018


API_BODY = r"""
from collectives import MPI
import collectives
comm = MPI.COMM_WORLD
n, r = comm.size, comm.rank
expect(comm.Get_rank() == r == comm.rank and comm.Get_size() == n, "ids", "rank/size")
expect(comm.local_size == n and comm.local_rank == r, "local", f"{comm.local_rank} {comm.local_size}")
expect(MPI.Is_initialized() and not MPI.Is_finalized(), "init", "Is_initialized")
expect(MPI.COMM_WORLD is comm, "world", "COMM_WORLD is one object")

def sane(tag):
    # the next collective works on every rank and the world agrees on it
    x = np.array([r + 1], dtype=np.int64)
    comm.Allreduce(MPI.IN_PLACE, x, op=MPI.SUM)
    expect(int(x[0]) == n * (n + 1) // 2, tag, f"next Allreduce gave {x[0]}")
    expect(not comm._core.broken, tag, "communicator broken after an argument error")

# --- [buf, MPI.X] specs
a = np.arange(5, dtype=np.int32) + r
out = np.zeros(5, dtype=np.int32)
comm.Allreduce([a, MPI.INT], [out, MPI.INT], op=MPI.SUM)
check("spec INT", out, np.arange(5, dtype=np.int32) * n + n * (n - 1) // 2)
f = np.full(3, 1.5 * (r + 1), dtype=np.float64)
comm.Allreduce(MPI.IN_PLACE, [f, MPI.DOUBLE], op=MPI.MAX)
check("spec DOUBLE", f, np.full(3, 1.5 * n))
g = np.zeros(4 * n, dtype=np.float32)
comm.Allgather([np.full(4, r, np.float32), MPI.FLOAT], [g, MPI.FLOAT])
check("Allgather spec", g, np.repeat(np.arange(n, dtype=np.float32), 4))
bb = np.arange(6, dtype=np.int64) if r == 0 else np.zeros(6, np.int64)
comm.Bcast([bb, MPI.LONG], root=0)
check("Bcast spec", bb, np.arange(6, dtype=np.int64))
bb = np.zeros(4, np.uint8) + r
comm.Bcast([bb, 4, MPI.BYTE], root=n - 1)
check("Bcast count spec", bb, np.full(4, n - 1, np.uint8))
mx = np.array([r * 2], dtype=np.int32)
comm.Allreduce(MPI.IN_PLACE, mx, op=MPI.MIN)
check("MIN", mx, np.array([0], np.int32))

# --- lowercase object collectives
expect(comm.allreduce(r + 1) == n * (n + 1) // 2, "allreduce int", "")
expect(comm.allreduce(r, op=MPI.MAX) == n - 1, "allreduce MAX", "")
expect(comm.allreduce(r, op=MPI.MIN) == 0, "allreduce MIN", "")
expect(comm.allreduce([r]) == list(range(n)), "allreduce list SUM", "concatenation in rank order")
expect(comm.allreduce(r + 1, op=MPI.PROD) == __import__("math").factorial(n), "allreduce PROD", "")
for root in range(n):
    d = comm.bcast({"root": root, "data": list(range(root + 3)), "s": "x" * 1000} if r == root else None, root=root)
    expect(d == {"root": root, "data": list(range(root + 3)), "s": "x" * 1000}, f"bcast dict root {root}", repr(d)[:100])
expect(comm.allgather(("r", r)) == [("r", k) for k in range(n)], "allgather", "")
expect(comm.allgather(None) == [None] * n, "allgather None", "")
big = comm.allgather(np.full(50_000, r, np.int16))
expect(all((x == k).all() and x.size == 50_000 for k, x in enumerate(big)), "allgather big", "")
for root in range(n):
    gathered = comm.gather(r * r, root=root)
    if r == root:
        expect(gathered == [k * k for k in range(n)], "gather", repr(gathered))
    else:
        expect(gathered is None, "gather non-root", repr(gathered))
    got = comm.scatter([f"item{k}" for k in range(n)] if r == root else None, root=root)
    expect(got == f"item{r}", "scatter", repr(got))
try:
    comm.allreduce(1.0, op=MPI.AVG)
    fail("allreduce AVG", "object AVG should raise ValueError")
except ValueError:
    pass
sane("after objects")

# --- argument errors: raised on every rank before any byte is sent
def expect_raises(tag, excs, fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except excs as exc:
        emit("argerr", case=tag, type=type(exc).__name__, message=str(exc))
    except BaseException as exc:
        fail(tag, f"raised {type(exc).__name__}: {exc}, expected {excs}")
    else:
        fail(tag, f"did not raise {excs}")
    sane(tag)

ro = np.zeros(4, np.float32); ro.setflags(write=False)
expect_raises("read-only recvbuf", ValueError, comm.Allreduce, np.ones(4, np.float32), ro)
expect_raises("read-only recvbuf in place", ValueError, comm.Allreduce, MPI.IN_PLACE, ro)
# the root only reads: a read-only buffer is fine there
src = np.arange(4, dtype=np.float32); src.setflags(write=False)
dst = src if r == 0 else np.zeros(4, np.float32)
comm.Bcast(dst, root=0)
check("read-only Bcast root", dst, np.arange(4, dtype=np.float32))
expect_raises("non-contiguous recvbuf", ValueError, comm.Allreduce, np.ones(4, np.float32), np.zeros(8, np.float32)[::2])
expect_raises("non-contiguous sendbuf", ValueError, comm.Allreduce, np.ones(8, np.float32)[::2], np.zeros(4, np.float32))
expect_raises("2d non-contiguous", ValueError, comm.Allreduce, MPI.IN_PLACE, np.zeros((4, 4), np.float64).T)
expect_raises("count mismatch", ValueError, comm.Allreduce, np.ones(4, np.float32), np.zeros(5, np.float32))
expect_raises("dtype mismatch", TypeError, comm.Allreduce, np.ones(4, np.int32), np.zeros(4, np.float32))
expect_raises("datatype spec mismatch", TypeError, comm.Allreduce, [np.ones(4, np.int32), MPI.INT], [np.zeros(4, np.float32), MPI.FLOAT])
expect_raises("unsupported dtype", TypeError, comm.Allreduce, MPI.IN_PLACE, np.zeros(4, np.complex64))
expect_raises("non-native byte order", TypeError, comm.Allreduce, MPI.IN_PLACE,
              np.zeros(4, np.dtype(np.float32).newbyteorder()))
expect_raises("non-native byte order memoryview", TypeError, comm.Allreduce, MPI.IN_PLACE,
              memoryview(np.zeros(4, np.dtype(np.float32).newbyteorder())))
expect_raises("bad op (core)", ValueError, comm._core.allreduce, None, np.zeros(4, np.float32), "median")
expect_raises("bad algorithm", ValueError, comm.Allreduce, MPI.IN_PLACE, np.zeros(4, np.float32), MPI.SUM, algorithm="bogus")
expect_raises("bad timeout", ValueError, comm.Allreduce, MPI.IN_PLACE, np.zeros(4, np.float32), timeout=-1)
expect_raises("bad root high", ValueError, comm.Bcast, np.zeros(4, np.float32), n)
expect_raises("bad root negative", ValueError, comm.Bcast, np.zeros(4, np.float32), -1)
base = np.zeros(10, np.float32)
expect_raises("overlapping buffers", ValueError, comm.Allreduce, base[0:6], base[4:10])
base = np.zeros(4 * n + 4, np.float32)
expect_raises("overlapping Allgather", ValueError, comm.Allgather, base[0:4], base[2:2 + 4 * n])
expect_raises("Allgather not multiple", ValueError, comm.Allgather, np.zeros(1, np.float32), np.zeros(n + 1, np.float32)) if n > 1 else None
expect_raises("Allgather send count", ValueError, comm.Allgather, np.zeros(2, np.float32), np.zeros(n, np.float32))
expect_raises("Allgatherv counts length", ValueError, comm.Allgatherv, np.zeros(1, np.float32), [np.zeros(n + 1, np.float32), [1] * (n + 1)])
expect_raises("Allgatherv block outside recvbuf", ValueError, comm.Allgatherv, np.zeros(1, np.float32), [np.zeros(n, np.float32), [1] * n, [n] * n])
expect_raises("Allgatherv negative count", ValueError, comm._core.allgatherv, None, np.zeros(n, np.float32), [-1] * n)
expect_raises("Reduce_scatter_block mismatch", ValueError, comm.Reduce_scatter_block, np.zeros(n * 3 + 1, np.float32), np.zeros(3, np.float32))
expect_raises("Reduce_scatter_block in place", ValueError, comm.Reduce_scatter_block, MPI.IN_PLACE, np.zeros(n * 3 + 1, np.float32)) if n > 1 else None
expect_raises("Iallreduce mismatch", ValueError, comm.Iallreduce, np.ones(4, np.float32), np.zeros(5, np.float32))
expect_raises("None recvbuf", TypeError, comm.Allreduce, np.zeros(4, np.float32), None)
expect_raises("bytes recvbuf", ValueError, comm.Allreduce, MPI.IN_PLACE, b"abcd")
verify_hashes(comm)
collectives.finalize()
expect(not MPI.Is_initialized(), "finalize", "still initialized")
"""


@pytest.mark.parametrize("n", [1, 3])
def test_mpi_api(n):
    res = run_world(n, API_BODY, timeout=80).assert_ok()
    names = [rec["case"] for rec in res[0].get("argerr")]
    assert len(names) >= 20, names
    assert all(len(rr.get("argerr")) == len(names) for rr in res.ranks)


def _check_train(res, n):
    recs = [rr.one("train") for rr in res.ranks]
    assert {r["size"] for r in recs} == {n}
    assert len({r["digest"] for r in recs}) == 1, "parameters differ across ranks"
    assert len({str(r["history"]) for r in recs}) == 1
    lr = 0.0078125
    expect_b0 = -lr * sum((n - 1) / 2 + step for step in range(5))
    assert all(abs(r["b0"] - expect_b0) < 1e-12 for r in recs), (recs[0]["b0"], expect_b0)
    assert all(r["counts"] == [10 * k for k in range(n)] for r in recs)


@pytest.mark.parametrize("n", [3, 4])
def test_mpi4py_script_under_launcher(n):
    res = run_world(n, script=SCRIPT, timeout=60, launcher=True).assert_ok()
    _check_train(res, n)


def _torchrun_env(port):
    return lambda rank, n: {"RANK": rank, "WORLD_SIZE": n, "LOCAL_RANK": rank,
                            "LOCAL_WORLD_SIZE": n, "MASTER_ADDR": "127.0.0.1",
                            "MASTER_PORT": port}


def _ompi_env(port):
    return lambda rank, n: {"OMPI_COMM_WORLD_RANK": rank, "OMPI_COMM_WORLD_SIZE": n,
                            "OMPI_COMM_WORLD_LOCAL_RANK": rank,
                            "OMPI_COMM_WORLD_LOCAL_SIZE": n,
                            "COLLECTIVES_STORE_ADDR": f"127.0.0.1:{port}"}


def _slurm_env(port):
    return lambda rank, n: {"SLURM_PROCID": rank, "SLURM_NTASKS": n, "SLURM_LOCALID": rank,
                            "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "localhost",
                            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}


@pytest.mark.parametrize("style", ["torchrun", "openmpi", "slurm"])
def test_mpi4py_script_under_other_launchers(style):
    n = 3
    if style == "torchrun":
        port = free_port(pair=True)  # torchrun's agent would hold MASTER_PORT; we use +1
        rank_env = _torchrun_env(port)
    else:
        port = free_port()
        rank_env = _ompi_env(port) if style == "openmpi" else _slurm_env(port)
    res = run_world(n, script=SCRIPT, rank_env=rank_env, timeout=60).assert_ok()
    _check_train(res, n)


def test_torchrun_store_is_master_port_plus_one():
    # something already listens on MASTER_PORT (torchrun's own TCPStore): we must not need it
    import socket

    port = free_port(pair=True)
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    holder.bind(("127.0.0.1", port))
    holder.listen(1)
    try:
        res = run_world(2, script=SCRIPT, rank_env=_torchrun_env(port), timeout=60).assert_ok()
        _check_train(res, 2)
    finally:
        holder.close()


BAD_OP_BODY = r"""
from collectives import MPI
comm = MPI.COMM_WORLD
for what, op in (("string", "sum"), ("None", None), ("int", 3)):
    for name, call in (("Allreduce", lambda: comm.Allreduce(MPI.IN_PLACE, np.zeros(4, np.float32), op)),
                       ("Reduce_scatter_block", lambda: comm.Reduce_scatter_block(
                           MPI.IN_PLACE, np.zeros(4 * comm.size, np.float32), op))):
        try:
            call()
            fail(dict(call=name, op=what), "accepted a non-Op op")
        except (TypeError, ValueError):
            pass
        except BaseException as exc:
            fail(dict(call=name, op=what), f"raised {type(exc).__name__}: {exc} (mpi4py: TypeError)")
"""


def test_bad_op_object_is_type_error():
    """mpi4py raises TypeError for an op that is not an MPI.Op; so must we."""
    run_world(1, BAD_OP_BODY, timeout=30).assert_ok()
