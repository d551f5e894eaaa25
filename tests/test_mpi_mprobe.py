"""Issue 39: matched probes (Mprobe/Improbe/mprobe/improbe and MPI.Message) with mpi4py's
semantics: the probed message leaves matching at once, so a receive posted afterwards
takes the next one and only the Message receives it. Real ranks on loopback, a few seconds.
"""
import pytest

from conftest import run_world

pytestmark = pytest.mark.timeout(120)

MPROBE = r"""
import numpy as np
from collectives import MPI
w = MPI.COMM_WORLD
r = w.rank
if r == 0:
    w.Send(np.arange(3, dtype=np.int32), 1, 7)
    w.Send(np.arange(10, 13, dtype=np.int32), 1, 7)   # same source and tag, second
    w.Send(np.array([1.5, 2.5]), 1, 8)
    w.send({"obj": 1}, 1, 9)
    w.send([2], 1, 9)
    w.Send(np.arange(4, dtype=np.int32), 1, 10)
    w.barrier()
else:
    st = MPI.Status()
    msg = w.Mprobe(0, 7, st)
    expect(bool(msg) and (st.source, st.tag, st.Get_count(MPI.INT)) == (0, 7, 3),
           "Mprobe status", f"{st.source} {st.tag} {st.Get_count(MPI.INT)}")
    second = np.zeros(3, np.int32)
    w.Recv(second, 0, 7)           # the probed message left matching: this is the second
    check("Recv after Mprobe", second, np.arange(10, 13, dtype=np.int32))
    first = np.zeros(3, np.int32)
    msg.Recv([first, MPI.INT], st)
    check("Message.Recv", first, np.arange(3, dtype=np.int32))
    expect(not msg and msg == MPI.MESSAGE_NULL, "after Recv", repr(msg))
    try:
        msg.Recv(first)
        fail("Recv of MESSAGE_NULL", "no error")
    except MPI.Exception as exc:
        expect(exc.Get_error_class() == MPI.ERR_REQUEST, "MESSAGE_NULL", str(exc))
    msg = None
    while msg is None:
        msg = w.Improbe(MPI.ANY_SOURCE, 8)
    small = np.zeros(1)
    try:                           # too small: refused, the message stays with msg
        msg.Recv(small)
        fail("truncate", "no error")
    except MPI.Exception as exc:
        expect(exc.Get_error_class() == MPI.ERR_TRUNCATE, "truncate", str(exc))
    try:
        msg.Recv(np.zeros(2, np.int64))
        fail("dtype", "no error")
    except MPI.Exception as exc:
        expect(exc.Get_error_class() == MPI.ERR_TYPE, "dtype", str(exc))
    out = np.zeros(2)
    req = msg.Irecv(out)
    req.Wait(st)
    check("Message.Irecv", out, np.array([1.5, 2.5]))
    expect((st.source, st.tag) == (0, 8) and not msg, "Irecv status", f"{st.source} {st.tag}")
    m1 = w.mprobe(0, 9)
    m2 = w.improbe(0, 9)
    while m2 is None:
        m2 = w.improbe(0, 9)
    expect(m2.irecv().wait() == [2] and m1.recv(st) == {"obj": 1} and st.tag == 9,
           "mprobe/improbe objects", "")
    msg = MPI.Message.Probe(w, 0, 10)
    out4 = np.zeros(4, np.int32)
    i = MPI.Request.Waitany([MPI.Request(), msg.Irecv(out4)])
    expect(i == 1, "Waitany with a Message's request", str(i))
    check("Message.Probe", out4, np.arange(4, dtype=np.int32))
    none = w.Mprobe(MPI.PROC_NULL, 0, st)
    expect(none == MPI.MESSAGE_NO_PROC and st.source == MPI.PROC_NULL, "PROC_NULL", repr(none))
    none.Recv(None, st)
    expect(st.source == MPI.PROC_NULL and st.Get_count() == 0 and not none, "NO_PROC Recv", "")
    expect(w.Improbe(0, 99) is None, "Improbe nothing", "")
    w.barrier()
emit("ok")
"""


def test_mprobe_message():
    """Mprobe/Improbe/mprobe/improbe and Message.Recv/Irecv/recv/irecv/Probe at 2 ranks:
    the probed message is the Message's alone, MESSAGE_NULL after, errors mpi4py's."""
    res = run_world(2, MPROBE, timeout=60, collective_timeout=30)
    res.assert_ok()
