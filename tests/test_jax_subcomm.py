"""collectives.jax with comm= a subcommunicator (issue 19, section 5): every call on
communicators from MPI.COMM_WORLD.Split / Dup, eager and under jax.jit, against numpy
references from rank-derived data; overlapping and disjoint communicators interleaved with
world calls in one jitted function; what is not a collectives communicator raises first."""
import pytest

from conftest import run_world

jax = pytest.importorskip("jax")

BODY = r"""
import jax
import jax.numpy as jnp
import collectives.jax as cj
from collectives import MPI

w = MPI.COMM_WORLD
n, r = w.size, w.rank
halves = w.Split(r % 2, r)                 # disjoint: evens, odds
rev = w.Split(0 if r < n - 1 else 1, -r)   # overlapping with halves, reversed order
dup = w.Dup()

def same(case, got, want):
    got, want = np.asarray(got), np.asarray(want)
    expect(got.shape == want.shape and np.array_equal(got, want), case,
           f"got {got.tolist()}, expected {want.tolist()}")

for name, c in [("halves", halves), ("rev", rev), ("dup", dup)]:
    ranks = c.allgather(r)  # world ranks in c's order
    m, me = c.size, c.rank
    x = jnp.arange(4, dtype=jnp.float32) + 10 * r
    for mode in ("eager", "jit") if c is not dup else ("eager",):
        wrap = jax.jit if mode == "jit" else (lambda f: f)
        case = f"{name} {mode}"
        same(f"allreduce {case}", wrap(lambda x: cj.allreduce(x, comm=c))(x),
             sum(np.arange(4, dtype=np.float32) + 10 * q for q in ranks))
        same(f"allgather {case}", wrap(lambda x: cj.allgather(x, comm=c))(x),
             np.stack([np.arange(4, dtype=np.float32) + 10 * q for q in ranks]))
        same(f"broadcast {case}", wrap(lambda x: cj.broadcast(x, m - 1, comm=c))(x),
             np.arange(4, dtype=np.float32) + 10 * ranks[-1])
        # the communicator and the world interleaved in one function (ordered effect)
        def mixed(x):
            a = cj.allreduce(x, comm=c)
            b = cj.allreduce(x)
            return a, b, cj.allreduce(a, "max", comm=c)
        a, b, mx = wrap(mixed)(x)
        same(f"mixed sub {case}", a, sum(np.arange(4, dtype=np.float32) + 10 * q for q in ranks))
        same(f"mixed world {case}", b, sum(np.arange(4, dtype=np.float32) + 10 * q
                                           for q in range(n)))
        same(f"mixed max {case}", mx, a)
        nxt, prv = (me + 1) % m, (me - 1) % m
        def ring(x, t):
            cj.send(x, nxt, tag=7, comm=c)
            return cj.recv(t, prv, tag=7, comm=c)
        same(f"send/recv {case}", wrap(ring)(x, jnp.zeros(4, jnp.float32)),
             np.arange(4, dtype=np.float32) + 10 * ranks[prv])
        got = wrap(lambda x, t: cj.sendrecv(x, t, prv, nxt, sendtag=8, recvtag=8, comm=c))(
            x, jnp.zeros(4, jnp.float32))
        same(f"sendrecv {case}", got, np.arange(4, dtype=np.float32) + 10 * ranks[prv])
        g = wrap(lambda x: cj.gather(x, 0, comm=c))(x)
        same(f"gather {case}", g, np.stack([np.arange(4, dtype=np.float32) + 10 * q
                                            for q in ranks]) if me == 0 else x)
        full = jnp.stack([jnp.full(4, 100. * k + r, jnp.float32) for k in range(m)])
        src = full if me == m - 1 else jnp.zeros(4, jnp.float32)
        same(f"scatter {case}", wrap(lambda s: cj.scatter(s, m - 1, comm=c))(src),
             np.full(4, 100. * me + ranks[-1], np.float32))
        red = wrap(lambda x: cj.reduce(x, "sum", 0, comm=c))(x)
        same(f"reduce {case}", red, sum(np.arange(4, dtype=np.float32) + 10 * q for q in ranks)
             if me == 0 else x)
        blocks = jnp.stack([jnp.full(3, 10. * r + j, jnp.float32) for j in range(m)])
        same(f"alltoall {case}", wrap(lambda b: cj.alltoall(b, comm=c))(blocks),
             np.stack([np.full(3, 10. * q + me, np.float32) for q in ranks]))
        wrap(lambda: cj.barrier(comm=c))() if mode == "eager" else cj.barrier(comm=c)

# not a collectives communicator, COMM_NULL, a freed one: errors before anything is sent
class Foreign:  # what an mpi4py communicator looks like to us: a handle, no _core
    handle = 12345
for what, bad, kind in [("foreign", Foreign(), TypeError), ("null", MPI.COMM_NULL, MPI.Exception)]:
    try:
        cj.allreduce(jnp.ones(2), comm=bad)
        fail(what, "accepted")
    except kind:
        pass
tmp = w.Dup()
tmp.Free()
try:
    cj.allreduce(jnp.ones(2), comm=tmp)
    fail("freed", "accepted")
except MPI.Exception as e:
    expect("freed" in str(e), "freed", str(e))
# a function compiled with a communicator, called after it was freed: a clear error from
# the handler (it holds the communicator's id, not its freed memory), and the world goes on
tmp = w.Dup()
compiled = jax.jit(lambda x: cj.allreduce(x, comm=tmp))
same("compiled before free", compiled(jnp.ones(2)), np.full(2, float(n), np.float32))
tmp.Free()
for _ in range(2):
    try:
        jax.block_until_ready(compiled(jnp.ones(2)))
        fail("compiled after free", "ran")
    except Exception as e:
        expect("is freed" in str(e) and "trace it again" in str(e), "compiled after free",
               f"{type(e).__name__}: {e}")
same("world after", cj.allreduce(jnp.ones(2)), np.full(2, float(n), np.float32))
"""


@pytest.mark.timeout(120)
def test_jax_comm_subcommunicators():
    run_world(3, BODY, timeout=110).assert_ok()
