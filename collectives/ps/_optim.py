"""Server-side optimizers: vectorized numpy updates of one float32 shard, torch's formulas.

An update is elementwise, so applying it to a flat shard equals applying it
to the tensors the shard was cut from. Each optimizer keeps its state per
shard (``state()``/``load_state()`` for checkpoints).
"""
from __future__ import annotations

import numpy as np


class SGD:
    """SGD with momentum, dampening, Nesterov and weight decay, as torch.optim.SGD computes it.

    Args:
        lr: learning rate.
        momentum: momentum factor (0: plain SGD).
        weight_decay: L2 penalty added to the gradient.
        dampening: dampening of the momentum.
        nesterov: Nesterov momentum.
    """

    name = "sgd"

    def __init__(self, lr: float, momentum: float = 0.0, weight_decay: float = 0.0,
                 dampening: float = 0.0, nesterov: bool = False) -> None:
        if lr < 0 or momentum < 0 or weight_decay < 0:
            raise ValueError(f"SGD: lr={lr}, momentum={momentum}, weight_decay={weight_decay} "
                             f"must be >= 0")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("SGD: Nesterov momentum needs momentum > 0 and dampening 0")
        self.lr, self.momentum, self.weight_decay = float(lr), float(momentum), float(weight_decay)
        self.dampening, self.nesterov = float(dampening), bool(nesterov)
        self.buf: np.ndarray | None = None

    def apply(self, p: np.ndarray, g: np.ndarray) -> None:
        """p -= lr * update(g), in place (g may be overwritten)."""
        f32 = np.float32
        if self.weight_decay:
            g += f32(self.weight_decay) * p
        if self.momentum:
            if self.buf is None:  # torch: the first step's buffer is the gradient itself
                self.buf = g.copy()
            else:
                self.buf *= f32(self.momentum)
                self.buf += f32(1.0 - self.dampening) * g
            if self.nesterov:
                g += f32(self.momentum) * self.buf
            else:
                g = self.buf
        p -= f32(self.lr) * g

    def state(self) -> dict:
        """Arrays and numbers to checkpoint."""
        return {} if self.buf is None else {"buf": self.buf}

    def load_state(self, state: dict) -> None:
        """Restore what state() returned."""
        self.buf = np.array(state["buf"], dtype=np.float32) if "buf" in state else None


class Adam:
    """Adam (with L2 weight decay, or decoupled as AdamW), as torch.optim.Adam/AdamW compute it.

    Args:
        lr: learning rate.
        betas: decay of the first and second moment estimates.
        eps: added to the denominator.
        weight_decay: L2 penalty (decoupled from the gradient if decoupled=True: AdamW).
        decoupled: AdamW's weight decay.
    """

    name = "adam"

    def __init__(self, lr: float = 1e-3, betas: tuple = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, decoupled: bool = False) -> None:
        b1, b2 = betas
        if lr < 0 or not (0 <= b1 < 1 and 0 <= b2 < 1) or eps < 0 or weight_decay < 0:
            raise ValueError(f"Adam: bad lr={lr}, betas={betas}, eps={eps} or "
                             f"weight_decay={weight_decay}")
        self.lr, self.b1, self.b2, self.eps = float(lr), float(b1), float(b2), float(eps)
        self.weight_decay, self.decoupled = float(weight_decay), bool(decoupled)
        self.t = 0
        self.m: np.ndarray | None = None
        self.v: np.ndarray | None = None

    def apply(self, p: np.ndarray, g: np.ndarray) -> None:
        """One Adam step on p, in place (g may be overwritten)."""
        f32 = np.float32
        if self.m is None:
            self.m = np.zeros_like(p)
            self.v = np.zeros_like(p)
        self.t += 1
        if self.weight_decay:
            if self.decoupled:
                p *= f32(1.0 - self.lr * self.weight_decay)
            else:
                g += f32(self.weight_decay) * p
        self.m *= f32(self.b1)
        self.m += f32(1.0 - self.b1) * g
        self.v *= f32(self.b2)
        self.v += f32(1.0 - self.b2) * g * g
        bc1 = 1.0 - self.b1 ** self.t
        bc2 = 1.0 - self.b2 ** self.t
        denom = np.sqrt(self.v) / f32(np.sqrt(bc2))
        denom += f32(self.eps)
        p -= f32(self.lr / bc1) * (self.m / denom)

    def state(self) -> dict:
        """Arrays and numbers to checkpoint."""
        if self.m is None:
            return {"t": np.int64(self.t)}
        return {"t": np.int64(self.t), "m": self.m, "v": self.v}

    def load_state(self, state: dict) -> None:
        """Restore what state() returned."""
        self.t = int(state["t"])
        self.m = np.array(state["m"], dtype=np.float32) if "m" in state else None
        self.v = np.array(state["v"], dtype=np.float32) if "v" in state else None


class DGCSGD:
    """The server's update for DGC-compressed pushes: momentum on the weight decay only.

    The workers' DGC already applied the gradient momentum (momentum
    correction), so, as collectives.torch.dgc.DGCSGD: ``p -= lr * (g + b)``
    with ``b = m*b + wd*p`` (Nesterov: ``p -= lr * (g + wd*p + m*b)``). At
    density 1 with every worker in every step this is torch.optim.SGD with the
    same lr, momentum, weight decay and nesterov flag.

    Args:
        lr: learning rate.
        momentum: must equal the workers' DGC momentum.
        weight_decay: L2 penalty.
        nesterov: must equal the workers' DGC nesterov flag.
    """

    name = "dgcsgd"

    def __init__(self, lr: float, momentum: float = 0.0, weight_decay: float = 0.0,
                 nesterov: bool = False) -> None:
        if lr < 0 or not 0 <= momentum < 1 or weight_decay < 0:
            raise ValueError(f"DGCSGD: lr={lr}, momentum={momentum}, weight_decay="
                             f"{weight_decay}: need lr, weight_decay >= 0, 0 <= momentum < 1")
        self.lr, self.momentum, self.weight_decay = float(lr), float(momentum), float(weight_decay)
        self.nesterov = bool(nesterov)
        self.buf: np.ndarray | None = None

    def apply(self, p: np.ndarray, g: np.ndarray) -> None:
        """p -= lr * (g + momentum-filtered weight decay), in place (g may be overwritten)."""
        f32 = np.float32
        if self.weight_decay:
            decay = f32(self.weight_decay) * p
            if self.momentum:
                if self.buf is None:
                    self.buf = decay.copy()
                else:
                    self.buf *= f32(self.momentum)
                    self.buf += decay
                if self.nesterov:
                    decay += f32(self.momentum) * self.buf
                else:
                    decay = self.buf
            g += decay
        p -= f32(self.lr) * g

    def state(self) -> dict:
        """Arrays and numbers to checkpoint."""
        return {} if self.buf is None else {"buf": self.buf}

    def load_state(self, state: dict) -> None:
        """Restore what state() returned."""
        self.buf = np.array(state["buf"], dtype=np.float32) if "buf" in state else None
