"""The defects mpi4py's own test suite found in collectives.MPI (issue 39), one case each, plus
a fuzz over buffer kinds and message specs (bench/mpi4py_suite.py runs mpi4py's suite itself).

- a process died on a DLPack capsule (legacy "dltensor" with a Python deleter) or returned
  SystemError; now every capsule is read in place and no deleter runs with an exception set;
- Scan, Exscan and Reduce_scatter wrote into a numpy copy of a recvbuf that is not a numpy
  array (a __dlpack__ or sequence-like object): now into the caller's memory;
- __cuda_array_interface__ over host memory broke the communicator (CUDA error); now it is
  host memory, and a refused one leaves the communicator usable;
- a message whose send completed was lost when the sender exited (send, Free, exit);
- message specs mpi4py accepts ([rbuf, 2], [rbuf, (1, 2), MPI.INT], [sbuf, 1, MPI.INT], None
  buffers) were refused or sent the whole buffer; constructors, pickling and names were missing.
"""
import pytest

from conftest import run_world

pytestmark = pytest.mark.timeout(180)

# Buffer kinds as mpi4py's arrayimpl makes them: a legacy-DLPack producer whose deleter is a
# ctypes callback (what crashed), a DLPack 1.0 producer, a __cuda_array_interface__ over host
# memory. All are sequence-like, so numpy.asarray() would copy them.
KINDS = r'''
import array, ctypes, pickle
import numpy as np
from collectives import MPI

class Seq:
    def __len__(self):
        return len(self.a)
    def __getitem__(self, i):
        return self.a[i]

class LegacyDL(Seq):
    """__dlpack__(stream=None) only (no max_version): a "dltensor" capsule whose deleter is
    Python code run through ctypes, as mpi4py's dlpackimpl makes it."""
    def __init__(self, a):
        self.a = a
    def __dlpack_device__(self):
        return (1, 0)
    def __dlpack__(self, stream=None):
        inner = self.a.__dlpack__()  # numpy's legacy capsule, kept alive by the closure
        kept = [inner]
        def release(_ptr):
            kept.clear()  # Python code in the deleter: must not run with an exception set
        self._cb = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(release)
        return inner

class VersionedDL(LegacyDL):
    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        return self.a.__dlpack__(max_version=(1, 0))

class HostCAI(Seq):
    """__cuda_array_interface__ over host memory (mpi4py's FakeGPUArray)."""
    def __init__(self, a, readonly=False):
        self.a = a
        self.__cuda_array_interface__ = {"version": 0, "shape": a.shape,
            "typestr": a.dtype.str, "data": (a.ctypes.data, readonly)}

w = MPI.COMM_WORLD
n, r = w.size, w.rank

def alive(case):
    """The communicator still works after a refusal."""
    out = np.empty(3, np.int64)
    w.Allreduce(np.full(3, r + 1, np.int64), out)
    check((case, "alive"), out, np.full(3, n * (n + 1) // 2, np.int64))
'''

WRITE_THROUGH = KINDS + r'''
for make in (LegacyDL, VersionedDL, HostCAI):
    kind = make.__name__
    # Scan / Exscan / Reduce_scatter into the caller's memory, not a numpy copy
    recv = np.full(2, -1, np.int32)
    w.Scan(np.array([0, 1], np.int32), make(recv))
    check((kind, "Scan"), recv, np.array([0, r + 1], np.int32))
    recv = np.full(2, -1, np.int32)
    w.Exscan(np.array([1, 2], np.int32), make(recv))
    if r > 0:
        check((kind, "Exscan"), recv, np.array([r, 2 * r], np.int32))
    recv = np.full(1, -1, np.int32)
    w.Reduce_scatter(np.arange(n, dtype=np.int32), make(recv), [1] * n)
    check((kind, "Reduce_scatter"), recv, np.array([n * r], np.int32))
    # what crashed: Scatterv into a legacy capsule, Allreduce, Ibcast
    recv = np.full(2, -1, np.float64)
    send = np.arange(2 * n, dtype=np.float64) if r == 0 else None
    w.Scatterv([send, [2] * n, None, MPI.DOUBLE] if r == 0 else None, make(recv), root=0)
    check((kind, "Scatterv"), recv, np.array([2 * r, 2 * r + 1], np.float64))
    recv = np.zeros(4, np.float32)
    w.Allreduce(make(np.ones(4, np.float32)), make(recv))
    check((kind, "Allreduce"), recv, np.full(4, n, np.float32))
    buf = np.arange(5, dtype=np.int64) if r == 0 else np.zeros(5, np.int64)
    w.Ibcast(make(buf), root=0).Wait()
    check((kind, "Ibcast"), buf, np.arange(5, dtype=np.int64))
    # refused before anything moves, on every rank alike; the communicator stays usable
    for bad in (make(np.zeros(2, np.int16)), make(np.zeros(2, np.complex64))):
        try:
            w.Allreduce(np.zeros(2, np.int16), bad)
            fail((kind, "dtype"), "accepted a type the core does not carry")
        except MPI.Exception as exc:
            expect(exc.Get_error_class() == MPI.ERR_TYPE and isinstance(exc, TypeError),
                   (kind, "ERR_TYPE"), repr(exc))
        alive(kind)
# zero-size buffers without memory (an empty array.array has a NULL pointer, which the core
# took for "no buffer": the root of a Gatherv sent its empty blocks instead of receiving)
for make in (lambda: array.array("i"), lambda: HostCAI(np.zeros(0, np.int32))):
    for root in range(n):
        w.Gatherv(make(), [make(), [0] * n] if r == root else None, root)
        w.Scatterv([make(), [0] * n] if r == root else None, make(), root)
        w.Gather(make(), make() if r == root else None, root)
        w.Reduce(make(), make() if r == root else None, root=root)
        w.Bcast(make(), root=root)
        w.Barrier()
    w.Alltoall(make(), make())
    w.Allgather(make(), make())
    w.Allreduce(make(), make())
    alive("zero-size")
ro = np.zeros(3, np.int32)
for bad in (HostCAI(ro, readonly=True), b"\0" * 12, memoryview(bytearray(12)).toreadonly()):
    try:
        w.Allreduce(np.zeros(3, np.int32), bad)
        fail(("readonly", type(bad).__name__), "wrote into a read-only buffer")
    except ValueError:
        pass
    alive("readonly")
emit("ok")
'''


def test_write_through_and_no_crash_for_every_buffer_kind():
    """Scan/Exscan/Reduce_scatter/Scatterv/Allreduce/Ibcast write into DLPack (legacy and
    versioned) and host __cuda_array_interface__ objects; refusals are clear and harmless."""
    for n in (1, 2, 3):
        res = run_world(n, WRITE_THROUGH, timeout=90).assert_ok()
        assert all(r.get("ok") for r in res.ranks), res.report()


SPECS = KINDS + r'''
# v-specs in every form mpi4py takes, the same on every rank
rbuf = np.full(2 * n, -1, np.int32)
w.Allgatherv(np.full(2, r, np.int32), [rbuf, 2])                # one count for all
check("Allgatherv [rbuf, 2]", rbuf, np.repeat(np.arange(n, dtype=np.int32), 2))
rbuf = np.full(2 * n, -1, np.int32)
w.Allgatherv(np.full(1, r, np.int32), [rbuf, (1, 2), MPI.INT])  # count 1, stride 2
want = np.full(2 * n, -1, np.int32); want[0::2] = np.arange(n)
check("Allgatherv [rbuf, (1, 2), INT]", rbuf, want)
sbuf = np.arange(10, dtype=np.int32)
rbuf = np.full(n, -1, np.int32)
w.Allgather([sbuf, 1, MPI.INT], rbuf)                            # a count below the buffer
check("Allgather [sbuf, 1, INT]", rbuf, np.zeros(n, np.int32))
rbuf = np.full(2, -1, np.int32)
w.Scatterv([np.arange(3 * n, dtype=np.int32), (2, 3), MPI.INT] if r == 0 else None,
           [rbuf, 2, MPI.INT], root=0)
check("Scatterv [sbuf, (2, 3), INT]", rbuf, np.array([3 * r, 3 * r + 1], np.int32))
g = np.full(n, -1, np.int32) if r == 0 else None
w.Gatherv([np.full(4, r, np.int32), 1, MPI.INT], [g, 1, MPI.INT] if r == 0 else None, root=0)
if r == 0:
    check("Gatherv counts 1", g, np.arange(n, dtype=np.int32))
buf = np.full(n, -1, np.int64); buf[r] = 10 + r
w.Allgather(None, buf)                                           # None: in place
check("Allgather(None, buf)", buf, 10 + np.arange(n, dtype=np.int64))
w.Sendrecv(None, MPI.PROC_NULL, 0, None, MPI.PROC_NULL, 0)
w.Isend([None, 0, "B"], MPI.PROC_NULL).Wait()
w.Recv(None, MPI.PROC_NULL)
# a datatype the core does not carry: MPI.Exception(ERR_TYPE) on every rank, nothing sent
for spec in ([np.zeros(2, np.int16), MPI.SHORT], [np.zeros(2, np.int32), 2, "h"]):
    try:
        w.Allreduce(MPI.IN_PLACE, spec)
        fail(("type", str(spec[-1])), "accepted")
    except MPI.Exception as exc:
        expect(exc.Get_error_class() == MPI.ERR_TYPE, ("class", str(spec[-1])), repr(exc))
    alive("type")
try:
    w.Allreduce(MPI.IN_PLACE, np.zeros(2, np.int32), op=MPI.MAXLOC)
    fail("MAXLOC", "accepted on a buffer")
except MPI.Exception as exc:
    expect(exc.Get_error_class() == MPI.ERR_OP, "ERR_OP", repr(exc))
try:  # counts that do not fit: an ArgumentError (MPI.Exception and ValueError) everywhere
    w.Allgatherv(np.zeros(1, np.int32), [np.zeros(n, np.int32), [1] * (n + 1)])
    fail("counts", "accepted")
except MPI.Exception as exc:
    expect(isinstance(exc, ValueError), "counts ValueError", repr(exc))
alive("specs")
# constructors, pickling, names
expect(not MPI.Request() and MPI.Request() == MPI.REQUEST_NULL, "Request()", "")
c = MPI.Comm(w)
expect(c == w and c is not w and c.Get_rank() == r, "Comm(comm)", repr(c))
expect(MPI.Comm() == MPI.COMM_NULL and MPI.COMM_NULL.Get_name() == "MPI_COMM_NULL",
       "COMM_NULL", "")
d = w.Dup(MPI.INFO_NULL)
expect(d.Compare(w) == MPI.CONGRUENT and w.Compare(c) == MPI.IDENT, "Compare", "")
d.Free()
expect(not MPI.Op() and MPI.Op() == MPI.OP_NULL, "Op()", "")
expect(pickle.loads(pickle.dumps(w)) == w, "pickle COMM_WORLD", "")
expect(pickle.loads(pickle.dumps(MPI.COMM_NULL)) is MPI.COMM_NULL, "pickle COMM_NULL", "")
expect(MPI.MINLOC((3, 1), (2, 5)) == (2, 5) and MPI.MAXLOC((3, 1), (3, 0)) == (3, 0), "LOC", "")
expect(MPI.SHORT == MPI.DATATYPE_NULL and MPI.INT.Get_size() == 4, "datatypes", "")
expect(MPI.Query_thread() == MPI.THREAD_SERIALIZED and MPI.get_vendor()[0] == "collectives"
       and MPI.Get_version() >= (3, 0) and isinstance(MPI.Get_library_version(), str), "env", "")
x = np.arange(4, dtype=np.int32)
y = np.ones(4, np.int32)
MPI.Op.Create(lambda a, b, dt: np.add(a, b, out=b), True).Reduce_local(x, y)
check("Op.Create Reduce_local", y, np.arange(4, dtype=np.int32) + 1)
emit("ok")
'''


def test_message_specs_constructors_and_names():
    """mpi4py's message-spec forms, in-place None, ERR_TYPE/ERR_OP refusals, constructors."""
    for n in (1, 2, 3):
        res = run_world(n, SPECS, timeout=90).assert_ok()
        assert all(r.get("ok") for r in res.ranks), res.report()


SEND_FREE_EXIT = r'''
import time
from collectives import MPI
w = MPI.COMM_WORLD
kind = sys.argv[1]
c = w if kind == "world" else (w.Dup() if kind == "dup" else w.Split(0, w.rank))
if w.rank == 0:
    for i in range(18):
        c.send({"i": i, "pad": "x" * 1000}, dest=1, tag=7)
    if c is not w:
        c.Free()
    # and exit at once
else:
    time.sleep(1.0)  # rank 0 has finished (and is exiting) before the first receive
    got = [c.recv(source=0, tag=7)["i"] for _ in range(18)]
    expect(got == list(range(18)), kind, str(got))
    emit("got", n=len(got))
'''


@pytest.mark.parametrize("kind", ["world", "dup", "split"])
def test_send_free_exit_loses_nothing(kind):
    """Rank 0 sends 18 objects, frees the communicator and exits; rank 1 gets all 18."""
    res = run_world(2, SEND_FREE_EXIT, args=[kind], timeout=60, collective_timeout=10)
    res.assert_ok()
    assert res[1].one("got")["n"] == 18, res.report()


FUZZ = KINDS + r'''
import random
rng = random.Random(int(sys.argv[1]))
CODES = "bBhHiIlLqQefdgFD?"
def make_buf(kind, code, count):
    if kind == "none":
        return None
    if kind in ("array", "bytes", "bytearray", "memoryview"):
        a = array.array(code if code in "bBhHiIlLqQfd" else "b", [1] * count)
        if kind == "array":
            return a
        raw = a.tobytes()
        return {"bytes": raw, "bytearray": bytearray(raw),
                "memoryview": memoryview(bytearray(raw))}[kind]
    a = np.ones(count, np.dtype(code))
    return {"numpy": a, "legacy": LegacyDL(a), "versioned": VersionedDL(a),
            "cai": HostCAI(a)}[kind]
def make_spec(buf, form, count):
    dt = rng.choice([MPI.INT, MPI.DOUBLE, MPI.BYTE, MPI.SHORT, "i", "d", "h", MPI.DATATYPE_NULL])
    return {"plain": buf, "typed": [buf, dt], "count": [buf, count // 2, dt],
            "countdispl": [buf, (count // 2, count - count // 2), dt], "bare": [buf, count]}[form]
calls = ["Allreduce", "Bcast", "Allgather", "Scan", "Reduce", "Sendrecv", "Alltoall"]
refused = done = 0
for case in range(int(sys.argv[2])):
    kind = rng.choice(["numpy", "array", "bytes", "bytearray", "memoryview", "legacy",
                       "versioned", "cai", "none"])
    code = rng.choice(CODES)
    count = rng.choice([0, 1, n, 3 * n])
    form = rng.choice(["plain", "typed", "count", "countdispl", "bare"])
    call = rng.choice(calls)
    if call == "Bcast" and kind == "bytes":
        call = "Allreduce"  # a one-rank refusal of a Bcast: test_one_rank_refuses_bcast
    try:
        spec = make_spec(make_buf(kind, code, count), form, count)
        out = [np.zeros(max(count, 1) * n, np.int64), MPI.BYTE]
        if call == "Allreduce":
            w.Allreduce(MPI.IN_PLACE, spec)
        elif call == "Bcast":
            w.Bcast(spec, root=0)
        elif call == "Allgather":
            w.Allgather(spec, out)
        elif call == "Scan":
            w.Scan(MPI.IN_PLACE, spec)
        elif call == "Reduce":
            w.Reduce(MPI.IN_PLACE if r == 0 else spec, spec if r == 0 else None, root=0)
        elif call == "Sendrecv":
            w.Sendrecv(spec, (r + 1) % n, 3, spec, (r - 1) % n, 3)
        else:
            w.Alltoall(MPI.IN_PLACE, spec)
        done += 1
    except (TypeError, ValueError, MPI.Exception, BufferError) as exc:
        refused += 1
    alive(("fuzz", case, kind, code, count, form, call))
emit("fuzz", refused=refused, done=done)
'''


@pytest.mark.parametrize("n,seed", [(1, 1), (2, 2), (3, 3)])
def test_fuzz_buffer_kinds_and_specs(n, seed):
    """Random (buffer kind, typecode, count, spec form, call), the same on every rank: every
    call completes or raises a Python exception on every rank; no process dies, nothing
    hangs, and the communicator works after each refusal."""
    res = run_world(n, FUZZ, args=[str(seed), "120"], timeout=150, collective_timeout=20)
    res.assert_ok()
    for rank in res.ranks:
        got = rank.one("fuzz")
        assert got and got["refused"] + got["done"] == 120, res.report()


ONE_RANK_REFUSES = r"""
import numpy as np
from collectives import MPI
w = MPI.COMM_WORLD
r = w.rank
kind = sys.argv[1]
try:
    if kind == "Gatherv":   # the root alone reads the v-spec, and it has too few counts
        w.Gatherv(np.full(1, r, np.int32), [np.zeros(8, np.int32), [1]] if r == 0 else None, 0)
    elif kind == "Reduce":  # the root alone writes recvbuf, and it is read-only
        w.Reduce(np.ones(2, np.int32), b"\0" * 8 if r == 0 else None, root=0)
    elif kind == "Scatter":  # the root's sendbuf does not split in size blocks
        w.Scatter(np.zeros(w.size + 1, np.int32) if r == 0 else None, np.zeros(1, np.int32), 0)
    elif kind == "Bcast":   # rank 1's buffer is read-only (same count and type)
        buf = np.ones(2, np.int32) if r == 0 else np.zeros(2, np.int32)
        buf.setflags(write=r != 1)
        w.Bcast(buf, root=0)
    else:                   # Ibcast past the fused size (the agreement, then the tree)
        buf = np.ones(1 << 16, np.int32) if r == 0 else np.zeros(1 << 16, np.int32)
        buf.setflags(write=r != 1)
        w.Ibcast(buf, root=0).Wait()
    fail(kind, "no rank refused")
except MPI.Exception as exc:
    emit("refused", text=str(exc))
if kind.endswith("bcast"):
    expect(r == 0 or not buf.any(), "nothing was sent", str(buf[:4]))
out = np.empty(1, np.int64)
w.Allreduce(np.ones(1, np.int64), out)  # the communicator is still usable
expect(out[0] == w.size, "after", str(out))
emit("ok")
"""


@pytest.mark.parametrize("kind", ["Gatherv", "Reduce", "Scatter"])
def test_one_rank_refuses_a_rooted_call(kind):
    """The root alone refuses its arguments: every other rank fails at once naming it (no
    timeout, nothing sent) and the communicator stays usable."""
    res = run_world(3, ONE_RANK_REFUSES, args=[kind], timeout=60, collective_timeout=30)
    res.assert_ok()
    assert res.elapsed < 25, res.report()  # not the 30 s timeout
    for rank in res.ranks[1:]:
        assert "refused its arguments: rank 0" in rank.one("refused")["text"], res.report()


@pytest.mark.parametrize("kind", ["Bcast", "Ibcast"])
def test_one_rank_refuses_bcast(kind):
    """The same for Bcast, whose buffer every rank reads: a non-root's read-only buffer is
    refused there, the refusing rank takes part in the root agreement (with the count it
    can read), and the others fail at once naming it."""
    res = run_world(3, ONE_RANK_REFUSES, args=[kind], timeout=60, collective_timeout=30)
    res.assert_ok()
    assert res.elapsed < 25, res.report()  # not the 30 s timeout
    assert "read-only" in res.ranks[1].one("refused")["text"], res.report()
    for rank in (res.ranks[0], res.ranks[2]):
        assert "refused its arguments: rank 1" in rank.one("refused")["text"], res.report()


EVERY_RANK_REFUSES = r"""
import numpy as np
from collectives import MPI
w = MPI.COMM_WORLD
for count in (4, 70000):  # the fused agreement (data in it) and the tree after it
    b = np.zeros(count, np.float32)
    for call in (lambda: w.Bcast(b, root=w.size + 3), lambda: w.Ibcast(b, root=-1).Wait()):
        try:
            call()
            fail(("bad root", count), "accepted")
        except (ValueError, MPI.Exception) as exc:
            expect("root" in str(exc), ("bad root", count), str(exc))
    out = np.empty(1, np.int64)
    w.Allreduce(np.ones(1, np.int64), out)  # the communicator is still usable
    expect(out[0] == w.size, ("after", count), str(out))
emit("ok")
"""


def test_every_rank_refusing_a_bcast():
    """Every rank refuses (the same bad root everywhere): each raises its own error at once
    and the communicator stays usable (the refusals' agreement used to take the root's
    data through the NULL buffer a refusing rank passes: a segfault on every rank)."""
    res = run_world(3, EVERY_RANK_REFUSES, timeout=60, collective_timeout=30)
    res.assert_ok()
    assert res.elapsed < 25, res.report()
    for rank in res.ranks:
        assert rank.one("ok") is not None, res.report()


SPLIT_TYPE = r"""
import numpy as np
from collectives import MPI
from collectives.rendezvous import world as _world
w = MPI.COMM_WORLD
r, n = w.rank, w.size
shared = w.Split_type(MPI.COMM_TYPE_SHARED)  # one host here: everyone
expect((shared.size, shared.rank) == (n, w.local_rank), "one host", f"{shared.size} {shared.rank}")
_world.host_id = lambda: f"host{r // 2}"  # as if ranks 0-1, 2-3, ... shared a host each
local = w.Split_type(MPI.COMM_TYPE_SHARED, key=-r)
mates = [k for k in range(n) if k // 2 == r // 2]
expect((local.size, local.rank) == (len(mates), sorted(mates, reverse=True).index(r)),
       "two per host", f"{local.size} {local.rank}")
out = np.empty(1, np.int64)
local.Allreduce(np.array([r], np.int64), out)
check("host sum", out, np.array([sum(mates)], np.int64))
null = w.Split_type(MPI.UNDEFINED if r == 0 else MPI.COMM_TYPE_SHARED)
expect((null is MPI.COMM_NULL) == (r == 0), "UNDEFINED", repr(null))
emit("ok")
"""


def test_split_type_shared_groups_ranks_by_host():
    """Split_type(COMM_TYPE_SHARED): the ranks with this rank's host id, by key then rank."""
    res = run_world(3, SPLIT_TYPE, timeout=60).assert_ok()
    assert all(r.get("ok") for r in res.ranks), res.report()


NONBLOCKING = r"""
import numpy as np
from collectives import MPI
w = MPI.COMM_WORLD
r, n = w.rank, w.size
for root in range(n):
    g = np.full(2 * n, -1, np.int32) if r == root else None
    red = np.zeros(3, np.int64) if r == root else None
    sc = np.full(2, -1, np.float64)
    scan = np.zeros(2, np.int32)
    ex = np.full(2, -7, np.int32)
    reqs = [w.Igather(np.full(2, r, np.int32), g, root),
            w.Ireduce(np.full(3, r + 1, np.int64), red, MPI.SUM, root),
            w.Iscatterv([np.arange(2 * n, dtype=np.float64), [2] * n] if r == root else None,
                        sc, root),
            w.Iscan(np.array([1, r], np.int32), scan),
            w.Iexscan(np.array([1, r], np.int32), ex)]
    MPI.Request.Waitall(reqs)
    if r == root:
        check(("Igather", root), g, np.repeat(np.arange(n, dtype=np.int32), 2))
        check(("Ireduce", root), red, np.full(3, n * (n + 1) // 2, np.int64))
    check(("Iscatterv", root), sc, np.array([2 * r, 2 * r + 1], np.float64))
    check(("Iscan", root), scan, np.array([r + 1, r * (r + 1) // 2], np.int32))
    if r > 0:
        check(("Iexscan", root), ex, np.array([r, r * (r - 1) // 2], np.int32))
emit("ok")
"""


def test_nonblocking_rooted_and_prefix_forms():
    """Igather, Ireduce, Iscatterv, Iscan, Iexscan in flight together, completed by Waitall."""
    for n in (1, 3):
        res = run_world(n, NONBLOCKING, timeout=60).assert_ok()
        assert all(r.get("ok") for r in res.ranks), res.report()


def _bor(a, b, dt):  # module level: a user op's function pickles by reference
    from collectives import MPI
    assert dt == MPI.BYTE and len(a) == len(b)
    for i in range(len(a)):
        b[i] = a[i] | b[i]


def _isum(a, b, dt):  # mpi4py's own pattern: b[:] takes a buffer of as many bytes
    import array

    from collectives import MPI
    assert dt == MPI.INT
    b[:] = array.array("i", [x + y for x, y in zip(memoryview(a).cast("i"),
                                                    memoryview(b).cast("i"))])


def test_user_ops_as_mpi4py_test_op():
    """test_op's rules: 32 live user ops at most (RuntimeError for the 33rd, Free and
    collection release them); Reduce_local gives the function the spec's datatype and
    bytes it can assign any buffer to; a user op pickles as a new op; toint/fromint;
    OP_NULL(None, None) is a ValueError."""
    import array
    import gc
    import pickle

    from collectives import MPI
    ops = [MPI.Op.Create(_bor) for _ in range(32)]
    with pytest.raises(RuntimeError, match="too many user-defined"):
        MPI.Op.Create(_bor)
    for op in ops[1:]:
        op.Free()
    b1, b2 = bytearray([2] * 3), bytearray([4] * 3)
    ops[0].Reduce_local([b1, MPI.BYTE], [b2, MPI.BYTE])
    assert list(b2) == [6, 6, 6] and list(b1) == [2, 2, 2]
    clone = MPI.Op.fromint(ops[0].toint())
    assert clone == ops[0] and MPI.Op.fromint(MPI.SUM.toint()) == MPI.SUM
    with pytest.raises(ValueError):
        clone.__reduce__()
    again = pickle.loads(pickle.dumps(ops[0]))
    assert again != ops[0] and not again.is_predefined
    ops = [MPI.Op.Create(_isum) for _ in range(30)]  # 2 live: ops[0]'s, again
    del ops
    gc.collect()
    isum = MPI.Op.Create(_isum)
    x, y = array.array("i", [1, 2, 3]), array.array("i", [10, 20, 30])
    isum.Reduce_local([x, MPI.INT], [y, MPI.INT])
    assert list(y) == [11, 22, 33]
    with pytest.raises(ValueError):
        MPI.OP_NULL(None, None)
