"""DGC's sparse exchange merged per host (collectives.torch.dgc_hosts).

In process: merge_union is the union-sum. Multi-process: ranks start in UTS
namespaces of their own with per-host hostnames (as tests/_netns.py's, but on
loopback: the exchange's result and bytes do not depend on link speed), so
the world has hosts; one launch (2 + 1 ranks, cyclic: uneven hosts) checks that

- the host-merged exchange gives exactly the flat exchange's sums (integer
  values: every association is exact), float16 values included;
- the bytes leaving a host are exactly its host's union in the merged
  layout, less than the host's buffers that the unmerged exchange sends
  where a host has two ranks selecting mostly the same indices (7/8 shared,
  as replicas of one model do); bench/README.md measures the ratio to a flat
  ring at 2 x 4 (1/3 or less from 3/4 shared);
- DistributedOptimizer with DGC takes this path on such a world (the sparse
  exchange in synchronize), trains the same parameters as host_merge=False
  within float rounding, and keeps every rank identical.

Needs root (unshare --uts), as tests/test_multihost.py.
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from conftest import run_world  # noqa: E402

from collectives.torch.dgc_hosts import merge_union  # noqa: E402


def test_merge_union_sums_equal_indices():
    parts = [(np.array([1.0, 2.0, 3.0], np.float32), np.array([5, 0, 9])),
             (np.array([10.0, 20.0], np.float32), np.array([9, 7])),
             (np.zeros(0, np.float32), np.zeros(0, np.int64)),
             (np.array([100.0], np.float32), np.array([5]))]
    vals, idx = merge_union(parts)
    assert idx.tolist() == [0, 5, 7, 9] and vals.tolist() == [2.0, 101.0, 20.0, 13.0]
    assert vals.dtype == np.float32 and idx.dtype == np.int64
    v, i = merge_union([])
    assert v.size == 0 and i.size == 0


BODY = r'''
import torch, torch.nn as nn
import collectives.torch as hvd
from collectives.torch import sparse_ops
from collectives.torch._context import current
from collectives.torch.dgc import DGC, DGCSGD
from collectives.torch.dgc_hosts import HostExchange

hvd.init()
torch.set_num_threads(1)
r, n = hvd.rank(), hvd.size()
core = current().world._core  # the world's: Horovod's own links belong to its negotiating thread
hx = HostExchange.create(core)
expect(hx is not None, "create", "no two-level world")
sizes, ks = [20000, 3001, 64], [40, 9, 64]

def selection(rank, host):
    """Integer values; 7/8 of a tensor's k indices shared by the ranks of a host, the rest
    the rank's own (replicas of one model select mostly the same entries)."""
    out = []
    for t, (s, k) in enumerate(zip(sizes, ks)):
        g = torch.Generator().manual_seed(1000 * t + host)
        perm = torch.randperm(s, generator=g)
        ns = (7 * k) // 8
        rest = perm[ns:]
        pick = torch.randperm(rest.numel(), generator=torch.Generator().manual_seed(7 + 31 * rank + t))
        idx = torch.cat([perm[:ns], rest[pick[:k - ns]]])
        vals = ((idx % 13) - 6 + rank).float()
        out.append((vals, idx.long()))
    return out

hosts = [int(h) for h in sys.argv[1].split(",")]
for fp16 in (False, True):
    fmt = sparse_ops.WireFormat(torch.float16 if fp16 else torch.float32, torch.int32)
    sel = selection(r, hosts[r])
    buf = sparse_ops.pack_selected(sel, [v.numel() for v, _ in sel], fmt)
    gathered, nbytes = sparse_ops.exchange(core, n, buf)
    flat = [torch.zeros(s) for s in sizes]
    sparse_ops.decode(gathered, nbytes, flat, ks, fmt)
    mg, msizes, mcaps = hx.exchange(buf, ks, sizes, fmt)
    merged = [torch.zeros(s) for s in sizes]
    sparse_ops.decode(mg, msizes, merged, mcaps, HostExchange.merged_format(fmt))
    case = dict(fp16=fp16)
    for t in range(len(sizes)):
        expect(torch.equal(flat[t], merged[t]), case, f"tensor {t}: merged != flat")
    # bytes: this host's bundle against the flat exchange's buffers
    union = {}
    for q in range(n):
        if hosts[q] == hosts[r]:
            for t, (v, i) in enumerate(selection(q, hosts[q])):
                union.setdefault(t, set()).update(i.tolist())
    L = hosts.count(hosts[r])
    want = sum(sparse_ops.buffer_bytes([sum((s * j) // L <= i < (s * (j + 1)) // L for i in union[t])
                                        for t, s in enumerate(sizes)], HostExchange.merged_format(fmt))
               for j in range(L))
    expect(hx.host_link_bytes == want, case, f"bundle {hx.host_link_bytes} B, the union's {want} B")
    emit("bytes", fp16=fp16, host=hosts[r], bundle=hx.host_link_bytes, flat=nbytes,
         local=hosts.count(hosts[r]))

# DistributedOptimizer: the merged path against host_merge=False
def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))

finals, sent = [], []
for merge in (True, False):
    m = model()
    comp = DGC(compress_ratio=0.05, momentum=0.9, min_numel=256, host_merge=merge)
    opt = hvd.DistributedOptimizer(DGCSGD(m.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=m.named_parameters(), compression=comp)
    expect((opt._hosts is not None) == merge, "optimizer", "host path not taken")
    for s in range(3):
        g = torch.Generator().manual_seed(100 * s + r)
        x, y = torch.randn(8, 64, generator=g), torch.randn(8, 1, generator=g)
        opt.zero_grad()
        nn.functional.mse_loss(m(x), y).backward()
        opt.step()
        expect(comp.stats["sparse_bytes"] > 0, "optimizer", "no sparse exchange")
        expect((comp.stats["host_link_bytes"] > 0) == merge, "optimizer", str(comp.stats))
    opt.remove_hooks()
    flatp = torch.cat([p.detach().reshape(-1) for p in m.parameters()])
    expect(all(torch.equal(o, flatp) for o in hvd.allgather_object(flatp)), "optimizer",
           "ranks differ")
    finals.append(flatp)
worst = (finals[0] - finals[1]).abs().max().item()
expect(worst <= 1e-5, "optimizer", f"merged vs flat DGC parameters differ by {worst:g}")
emit("ok")
'''


def _uts_prefix(hosts):
    def prefix(rank):
        return ["unshare", "--uts", "sh", "-c", f'hostname dgch{hosts[rank]} && exec "$@"', "rank"]
    return prefix


@pytest.mark.timeout(120)
def test_host_merged_exchange_equals_flat():
    from conftest import free_port

    hosts = [0, 1, 0]
    n, port = len(hosts), free_port()

    def rank_env(rank, size):  # no local-rank variables: the host ids say who shares a host
        return {"COLLECTIVES_RANK": rank, "COLLECTIVES_SIZE": size,
                "COLLECTIVES_STORE_ADDR": f"127.0.0.1:{port}"}

    res = run_world(n, BODY, args=[",".join(map(str, hosts))], rank_env=rank_env,
                    prefix=_uts_prefix(hosts), timeout=100).assert_ok()
    assert res[0].get("ok"), res.report()
    for fp16 in (False, True):
        rows = [x for q in range(n) for x in res[q].get("bytes") if x["fp16"] == fp16]
        flat = rows[0]["flat"]
        for x in rows:
            if x["local"] > 1:  # below the unmerged exchange (the host's L buffers cross)
                assert x["bundle"] < x["local"] * min(flat), (x, res.report())
