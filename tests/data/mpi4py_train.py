"""A data-parallel training loop written for mpi4py, using only its common subset.

Only the import line differs from an mpi4py script. Rank 0 initialises the
parameters and broadcasts them; every step each rank computes a gradient on its
own shard, the gradients are averaged with Allreduce(IN_PLACE), and the ranks'
metrics are gathered with allgather. Prints one JSON line with the final state.
"""
import hashlib
import json
import sys

import numpy as np

from collectives import MPI  # was: from mpi4py import MPI

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
size = comm.Get_size()

# rank 0 owns the initial parameters (others start with garbage)
if rank == 0:
    params = {"w": np.linspace(-1.0, 1.0, 1000).astype(np.float32), "b": np.zeros(10, np.float64)}
else:
    params = None
params = comm.bcast(params, root=0)
w, b = params["w"], params["b"]
assert w.dtype == np.float32 and w.shape == (1000,)

# a deterministic shard per rank
rng = np.random.default_rng(1234 + rank)
x = rng.integers(-4, 5, size=(64, 1000)).astype(np.float32)
lr = 0.0078125
history = []
for step in range(5):
    grad_w = (x.T @ (x @ w)) / 64.0
    grad_w = np.round(grad_w * 64) / 64  # keep values exact in float32 for the test
    grad_w = grad_w.astype(np.float32)
    grad_b = np.full(10, float(rank + step), dtype=np.float64)
    comm.Allreduce(MPI.IN_PLACE, grad_w, op=MPI.SUM)
    comm.Allreduce(MPI.IN_PLACE, [grad_b, MPI.DOUBLE], op=MPI.SUM)
    grad_w /= size
    grad_b /= size
    w -= lr * grad_w
    b -= lr * grad_b
    loss = float(np.mean((x @ w) ** 2))
    metrics = comm.allgather({"rank": rank, "step": step, "loss": loss})
    assert [m["rank"] for m in metrics] == list(range(size))
    total = comm.allreduce(loss, op=MPI.SUM)
    worst = comm.allreduce(loss, op=MPI.MAX)
    history.append((round(total, 3), round(worst, 3)))

counts = np.zeros(size, dtype=np.int64)
comm.Allgather(np.array([rank * 10], dtype=np.int64), counts)
comm.Barrier()
digest = hashlib.sha1(w.tobytes() + b.tobytes()).hexdigest()
print("@@ " + json.dumps({"tag": "train", "rank": rank, "size": size, "digest": digest,
                          "b0": float(b[0]), "counts": counts.tolist(), "history": history}))
sys.stdout.flush()
