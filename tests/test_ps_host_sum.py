"""collectives.ps with init(host_sum=True): one push per host, on ranks with per-host hostnames.

Ranks start in UTS namespaces of their own (hostnames h0, h1, ...; loopback
links, as tests/test_dgc_hosts.py), 4 workers on two hosts and the server on
a third. Sync training with the host sums gives the single-process SGD of
the global batch (as tests/test_ps.py without them), the server receives
pushes only from each host's first worker, once per step, and its step
reports still name every worker; modes whose contract a host sum would
break are refused. Needs root (unshare --uts).
"""
from __future__ import annotations

import numpy as np
import pytest

import _ps_model as M
from conftest import free_port, run_world

BODY = """
import numpy as np, collectives, collectives.ps as ps
import _ps_model as M
role = ps.init(num_servers=1, host_sum=True)
if role.is_server:
    got = []
    reps = ps.serve(M.SHAPES, ps.SGD(lr=0.05, momentum=0.9, weight_decay=0.01), "sync",
                    server=got.append)
    emit("reports", steps=[(r.step, r.contributors) for r in reps],
         pushes={str(k): v for k, v in got[0].pushes.items()}, groups=[list(g) for g in role.groups])
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
def test_host_sum_pushes_once_per_host_and_equals_sgd():
    steps, hosts = 6, [0, 1, 0, 1, 2]  # workers 0..3 cyclic on two hosts, the server alone
    port = free_port()

    def rank_env(rank, size):
        return {"COLLECTIVES_RANK": rank, "COLLECTIVES_SIZE": size,
                "COLLECTIVES_STORE_ADDR": f"127.0.0.1:{port}"}

    def prefix(rank):
        return ["unshare", "--uts", "sh", "-c", f'hostname psh{hosts[rank]} && exec "$@"', "rank"]

    res = run_world(5, BODY.replace("STEPS", str(steps)), rank_env=rank_env, prefix=prefix,
                    timeout=80).assert_ok()
    want = M.sgd_reference(steps, 0.05, 0.9, 0.01)
    for r in range(4):
        rec = res[r].one("final")
        assert rec["versions"] == [steps]
        np.testing.assert_allclose(np.array(rec["params"]), want, atol=1e-5, rtol=0)
    srv = res[4].one("reports")
    assert srv["groups"] == [[0, 2], [1, 3]]
    assert srv["pushes"] == {"0": steps, "1": steps}  # each host's first worker, once a step
    assert [s for s, _ in srv["steps"]] == list(range(steps))
    assert all(sorted(c) == [0, 1, 2, 3] for _, c in srv["steps"])


def test_host_sum_refuses_modes_it_would_break():
    import collectives.ps as ps

    layout = ps.Layout([(3,)], 1)
    links = {0: None, 1: None, 2: None}
    for mode, backup in (("async", 0), ("ssp", 0), ("sync", 1)):
        with pytest.raises(ValueError, match="host_sum"):
            ps.Server(links, layout, 0, ps.SGD(lr=1.0), mode, backup_workers=backup,
                      groups={0: [0, 1]})
    srv = ps.Server(links, layout, 0, ps.SGD(lr=1.0), "sync", groups={0: [0, 1]})
    srv.set_params(np.zeros(3, np.float32))
    # worker 2's gradient, then the group's sum (of two) as _push leaves them: the mean of three
    with srv.cv:
        srv.acc[:] = np.array([3.0, 0, 0], np.float32)
        srv.contributors = [2]
        srv.acc += np.array([3.0, 3.0, 0], np.float32)
        srv.contributors.extend(srv.groups.get(0, [0]))
        srv._maybe_complete()
    np.testing.assert_allclose(srv.params, [-2.0, -1.0, 0.0])
    assert srv.reports[-1].contributors == [0, 1, 2] and srv.version == 1
