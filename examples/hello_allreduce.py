"""Average a "gradient" across ranks, mpi4py style.

    collectives-run -np 4 python examples/hello_allreduce.py
"""
import numpy as np

from collectives import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()

# Every rank starts from rank 0's parameters.
params = comm.bcast(np.random.default_rng(0).standard_normal(4) if rank == 0 else None, root=0)

# Each rank's gradient differs; the average is the same everywhere.
grad = np.full(1_000_000, float(rank), dtype=np.float32)
comm.Allreduce(MPI.IN_PLACE, grad, op=MPI.SUM)
grad /= size
expected = (size - 1) / 2
assert np.allclose(grad, expected), grad[:4]

losses = comm.allgather(round(float(params.sum()) + rank, 3))
if rank == 0:
    print(f"{size} ranks: mean gradient {grad[0]:.2f} (expected {expected:.2f}); losses {losses}")
