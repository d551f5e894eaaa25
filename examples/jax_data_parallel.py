"""Data-parallel training of a small JAX MLP: each rank takes a shard of the
global batch, and the jitted step averages the gradients over the ranks.

    collectives-run -np 2 python examples/jax_data_parallel.py [--steps 50]

Every rank ends with the same parameters, equal (up to float rounding) to
those of one process training on the whole global batch. The data is a
generated regression problem; nothing is downloaded.
"""
from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

GLOBAL_BATCH = 96  # divisible by 1, 2, 3, 4, 6, 8 ranks: equal shards keep mean-of-means exact
FEATURES, HIDDEN = 8, 32
LR = 0.1


def init_params(key):
    """A 2-layer MLP's weights (the same on every rank: same key)."""
    k1, k2 = jax.random.split(key)
    return {"w1": jax.random.normal(k1, (FEATURES, HIDDEN)) / np.sqrt(FEATURES),
            "b1": jnp.zeros(HIDDEN),
            "w2": jax.random.normal(k2, (HIDDEN, 1)) / np.sqrt(HIDDEN),
            "b2": jnp.zeros(1)}


def global_batch(step):
    """Step `step`'s global batch: x ~ N(0, 1), y = sin(x . w_true) + noise."""
    kx, kn = jax.random.split(jax.random.PRNGKey(1000 + step))
    x = jax.random.normal(kx, (GLOBAL_BATCH, FEATURES))
    w_true = jnp.linspace(-1.0, 1.0, FEATURES)
    y = jnp.sin(x @ w_true)[:, None] + 0.05 * jax.random.normal(kn, (GLOBAL_BATCH, 1))
    return x, y


def loss_fn(params, x, y):
    """Mean squared error of the MLP on (x, y)."""
    h = jnp.tanh(x @ params["w1"] + params["b1"])
    return jnp.mean((h @ params["w2"] + params["b2"] - y) ** 2)


def make_step(average):
    """The jitted SGD step; `average` turns local gradients into global ones."""

    @jax.jit
    def step(params, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        grads, loss = average((grads, loss))
        return jax.tree.map(lambda p, g: p - LR * g, params, grads), loss

    return step


def train(steps, rank=0, size=1, average=lambda t: t, start=None, log_every=0):
    """Run `steps` SGD steps on this rank's shard of each global batch; returns params."""
    params = start if start is not None else init_params(jax.random.PRNGKey(0))
    step = make_step(average)
    shard = GLOBAL_BATCH // size
    for i in range(steps):
        x, y = global_batch(i)
        params, loss = step(params, x[rank * shard:(rank + 1) * shard],
                            y[rank * shard:(rank + 1) * shard])
        if log_every and rank == 0 and (i % log_every == 0 or i == steps - 1):
            print(f"step {i:4d}  loss {float(loss):.5f}", flush=True)
    return params


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--dump", help="rank 0 saves the final parameters here (.npz)")
    args = ap.parse_args()

    import collectives
    import collectives.jax as cj

    comm = collectives.init()
    rank, size = comm.rank, comm.size
    if GLOBAL_BATCH % size:
        raise SystemExit(f"the global batch ({GLOBAL_BATCH}) must divide evenly over {size} ranks")
    # Same key everywhere already; the broadcast shows how to start from rank
    # 0's parameters when initialisation is not reproducible.
    params = cj.broadcast(init_params(jax.random.PRNGKey(0)), root=0)
    params = train(args.steps, rank, size, lambda t: cj.allreduce(t, op="mean"), params,
                   log_every=10)
    if rank == 0:
        print(f"{size} ranks, {args.steps} steps, global batch {GLOBAL_BATCH}")
        if args.dump:
            np.savez(args.dump, **{k: np.asarray(v) for k, v in params.items()})
    collectives.finalize()


if __name__ == "__main__":
    main()
