"""collectives.ps: sync/backup/async/SSP on real ranks (servers are the last ranks)."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import run_world
import _ps_model as M

PRELUDE = """
import numpy as np, collectives, collectives.ps as ps
import _ps_model as M
role = ps.init(num_servers=NSERVERS)
"""


def _run(n, servers, body, timeout=40.0, **kw):
    src = PRELUDE.replace("NSERVERS", str(servers)) + body
    return run_world(n, src, timeout=timeout, **kw)


SYNC = """
if role.is_server:
    reps = ps.serve(M.SHAPES, ps.SGD(lr=0.05, momentum=0.9, weight_decay=0.01), "sync")
    emit("reports", steps=[(r.step, r.contributors, r.dropped) for r in reps])
else:
    w = ps.worker(M.SHAPES)
    flat = w.start(M.initial() if role.index == 0 else None)
    n = role.num_workers
    for k in range(STEPS):
        flat = w.push_pull(M.grad(flat, k, slice(role.index, None, n)))
    emit("final", params=flat.tolist(), versions=w.versions)
    w.finish()
"""


@pytest.mark.timeout(90)
@pytest.mark.parametrize("n,servers", [(3, 1), (5, 2)])
def test_sync_equals_single_process_sgd(n, servers):
    steps = 15
    res = _run(n, servers, SYNC.replace("STEPS", str(steps))).assert_ok()
    want = M.sgd_reference(steps, 0.05, 0.9, 0.01)
    workers = n - servers
    for r in range(workers):
        rec = res[r].one("final")
        assert rec["versions"] == [steps] * servers
        np.testing.assert_allclose(np.array(rec["params"]), want, atol=1e-5, rtol=0)
    for r in range(workers, n):
        steps_seen = res[r].one("reports")["steps"]
        assert [s for s, _, _ in steps_seen] == list(range(steps))
        assert all(c == list(range(workers)) and d == [] for _, c, d in steps_seen)
