"""Gradients through collectives.torch's ops match Horovod's autograd functions.

Each rank r weights the op's output with its own weights w_r (known to every
rank), so the gradient on rank r is a hand-computed function of every rank's
weights: Horovod's conventions (allgather and broadcast average the gradient
over ranks; reducescatter's is the allgather of the gradient, times the rank
count for Sum; alltoall's goes back along the received splits; grouped
allreduce's is the grouped allreduce of the gradients). Before the fix,
alltoall, reducescatter and grouped_allreduce returned detached tensors
(x.grad stayed None), and allgather/broadcast summed (size x Horovod's).
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from conftest import run_world  # noqa: E402

GRAD_BODY = r'''
import torch
import collectives.torch as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()

def w(k, shape, seed):
    """Rank k's weights for one case (every rank can compute every rank's)."""
    g = torch.Generator().manual_seed(7919 * seed + k)
    return torch.randint(-4, 5, shape, generator=g).to(torch.float64)

def close(case, got, want):
    if got is None:
        fail(case, "no gradient (the op's output was detached)")
    elif tuple(got.shape) != tuple(want.shape) or not torch.allclose(got, want, atol=1e-9, rtol=0):
        fail(case, f"got {got.flatten()[:8].tolist()} {tuple(got.shape)}, expected "
                   f"{want.flatten()[:8].tolist()} {tuple(want.shape)}")

def leaf(shape, seed):
    return (w(r, shape, seed + 100) + 0.5).requires_grad_(True)

# allgather, uneven dim 0 (rank k has k + 1 rows): rank r's rows of the average weight
rows = [k + 1 for k in range(n)]
off = sum(rows[:r])
x = leaf((rows[r], 3), 1)
(hvd.allgather(x) * w(r, (sum(rows), 3), 1)).sum().backward()
avg = sum(w(k, (sum(rows), 3), 1) for k in range(n)) / n
close("allgather", x.grad, avg[off:off + rows[r]])

# broadcast from each root: the root gets the average weight, the others zeros
for root in range(n):
    x = leaf((4,), 2)
    (hvd.broadcast(x, root) * w(r, (4,), 2 + root)).sum().backward()
    want = sum(w(k, (4,), 2 + root) for k in range(n)) / n if r == root else torch.zeros(4, dtype=torch.float64)
    close(f"broadcast root={root}", x.grad, want)

# alltoall with uneven splits: table[i][j] rows from rank i to rank j
table = [[(i + 2 * j) % 3 for j in range(n)] for i in range(n)]
x = leaf((sum(table[r]), 2), 3)
out, received = hvd.alltoall(x, splits=table[r])
expect(received.tolist() == [table[i][r] for i in range(n)], "alltoall splits", str(received))
expect(out.requires_grad, "alltoall", "output does not require grad")
(out * w(r, tuple(out.shape), 3)).sum().backward()
want = []
for j in range(n):  # the block sent to j: j's weights at the rows j received from r
    wj = w(j, (sum(table[i][j] for i in range(n)), 2), 3)
    at = sum(table[i][j] for i in range(r))
    want.append(wj[at:at + table[r][j]])
close("alltoall splits", x.grad, torch.cat(want))
x = leaf((2 * n, 2), 4)  # even split, no splits argument: returns the tensor alone
out = hvd.alltoall(x)
(out * w(r, (2 * n, 2), 4)).sum().backward()
close("alltoall even", x.grad, torch.cat([w(j, (2 * n, 2), 4)[2 * r:2 * r + 2] for j in range(n)]))

# reducescatter (dim 0 = 2n + 1: the first rank gets one row more)
d0 = 2 * n + 1
share = [d0 // n + (1 if i < d0 % n else 0) for i in range(n)]
for op, factor, pre, post in [(hvd.Sum, n, 1.0, 1.0), (hvd.Average, 1, 1.0, 1.0), (hvd.Sum, n, 0.5, 3.0),
                              (hvd.Average, 1, 2.0, 0.25)]:
    x = leaf((d0, 2), 5)
    y = hvd.reducescatter(x, op=op, prescale_factor=pre, postscale_factor=post)
    expect(tuple(y.shape) == (share[r], 2), "reducescatter shape", str(tuple(y.shape)))
    (y * w(r, (share[r], 2), 5)).sum().backward()
    want = torch.cat([w(j, (share[j], 2), 5) for j in range(n)]) * (factor * pre * post)
    close(f"reducescatter {op.name} pre={pre} post={post}", x.grad, want)

# grouped_allreduce: each tensor as allreduce (Sum: the summed weights, Average: their mean)
for op, div in [(hvd.Sum, 1), (hvd.Average, n)]:
    xs = [leaf((3,), 6), leaf((2, 2), 7)]
    ys = hvd.grouped_allreduce(xs, op=op)
    sum((y * w(r, tuple(y.shape), 8 + i)).sum() for i, y in enumerate(ys)).backward()
    for i, x in enumerate(xs):
        close(f"grouped_allreduce {op.name} [{i}]", x.grad,
              sum(w(k, tuple(x.shape), 8 + i) for k in range(n)) / div)

# grouped allgather / reducescatter: each tensor as its single form
xs = [leaf((rows[r], 2), 10), leaf((rows[r],), 11)]
ys = hvd.grouped_allgather(xs)
sum((y * w(r, tuple(y.shape), 12 + i)).sum() for i, y in enumerate(ys)).backward()
for i, x in enumerate(xs):
    avg = sum(w(k, tuple(ys[i].shape), 12 + i) for k in range(n)) / n
    close(f"grouped_allgather [{i}]", x.grad, avg[off:off + rows[r]])
xs = [leaf((d0, 2), 13)]
ys = hvd.grouped_reducescatter(xs, op=hvd.Sum)
(ys[0] * w(r, (share[r], 2), 14)).sum().backward()
close("grouped_reducescatter", xs[0].grad, torch.cat([w(j, (share[j], 2), 14) for j in range(n)]) * n)
'''


@pytest.mark.timeout(90)
@pytest.mark.parametrize("n", [2, 3])
def test_gradients_match_horovod(n):
    res = run_world(n, GRAD_BODY, launcher=True, timeout=80)
    for rank in range(n):
        assert res[rank].get("fail") == [], res.report()
    res.assert_ok()
    for rank in range(n):
        assert res[rank].one("done")["failures"] == 0
