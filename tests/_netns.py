"""Several "hosts" on one machine, for multi-host tests and benchmarks (needs root).

``Cluster(hosts=2, rate="1gbit")`` builds one network namespace per host and
one for a switch: a bridge in the switch namespace, a veth pair from each host
to it, an address 10.77.0.<h+1>/24 on each host, and a tc tbf rate limit on
both ends of every host link (netem is not in every kernel; tbf is). A rank
runs inside its host's namespace under a UTS namespace of its own whose
hostname is the host's (``Cluster.prefix``), so ranks of one host share a host
id and talk over shared memory, and ranks of different hosts talk over TCP
through the shaped links. Nothing is routed out of these namespaces.

Names are unique per cluster (pid and a counter), and every namespace is
deleted on exit from the ``with`` block whatever happened, and at interpreter
exit for any left behind (a test killed by pytest-timeout still unwinds the
``with``); a cluster whose process was killed outright is deleted by the next
one built. Building a cluster that the kernel refuses raises ClusterError: a
test that needs one fails, it does not skip.

Placement: ``Cluster.hosts_of(n, "block"|"cyclic"|[h0, h1, ...])`` maps ranks
to hosts; ``rank_env`` gives run_world each rank's rendezvous variables (the
store on rank 0's host address), ``prefix`` the command that enters the
rank's host.
"""
from __future__ import annotations

import atexit
import itertools
import os
import re
import shutil
import subprocess
from typing import Callable, List, Sequence, Union

_counter = itertools.count()
_LIVE: set = set()  # namespace names not yet deleted


class ClusterError(RuntimeError):
    """The namespaces, links or shaping could not be set up."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    res = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and res.returncode != 0:
        raise ClusterError(f"ip {' '.join(args)} failed ({res.returncode}): {res.stderr.strip()}")
    return res


def _delete(name: str) -> None:
    _ip("netns", "del", name, check=False)
    _LIVE.discard(name)


@atexit.register
def _delete_all() -> None:
    for name in list(_LIVE):
        _delete(name)


def _delete_orphans() -> None:
    """Deletes clusters whose creating process is gone (killed before its atexit ran)."""
    for name in _ip("netns", "list", check=False).stdout.split():
        m = re.fullmatch(r"c(\d+)x\d+-(sw|h\d+)", name)
        if m and not os.path.exists(f"/proc/{m.group(1)}"):
            _delete(name)


class Cluster:
    """H hosts as network namespaces on a bridge; see the module docstring."""

    def __init__(self, hosts: int, rate: str = "1gbit", burst: str = "512kb"):
        if hosts < 1:
            raise ValueError(f"a cluster needs at least one host, got {hosts}")
        self.nhosts = hosts
        self.rate = rate
        self.burst = burst
        self.tag = f"c{os.getpid()}x{next(_counter)}"
        self.switch = f"{self.tag}-sw"
        self.names = [f"{self.tag}-h{h}" for h in range(hosts)]
        self.placement: List[int] = []

    @staticmethod
    def addr(h: int) -> str:
        """The address of host h (inside the cluster only)."""
        return f"10.77.0.{h + 1}"

    def hostname(self, h: int) -> str:
        """Host h's hostname, which its ranks' host ids start with."""
        return f"{self.tag}-host{h}"

    def __enter__(self) -> "Cluster":
        if os.geteuid() != 0:
            raise ClusterError("network namespaces need root (CI runs the suite as root)")
        for tool in ("ip", "tc", "unshare"):
            if shutil.which(tool) is None:
                raise ClusterError(f"{tool} is not installed (iproute2, util-linux)")
        _delete_orphans()
        try:
            self._build()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _ns(self, ns: str, *cmd: str) -> None:
        _ip("netns", "exec", ns, *cmd)

    def _shape(self, ns: str, dev: str) -> None:
        self._ns(ns, "tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", self.rate,
                 "burst", self.burst, "latency", "100ms")

    def _build(self) -> None:
        _ip("netns", "add", self.switch)
        _LIVE.add(self.switch)
        self._ns(self.switch, "ip", "link", "add", "br0", "type", "bridge")
        self._ns(self.switch, "ip", "link", "set", "br0", "up")
        for h, ns in enumerate(self.names):
            _ip("netns", "add", ns)
            _LIVE.add(ns)
            _ip("link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", f"p{h}",
                "netns", self.switch)
            self._ns(self.switch, "ip", "link", "set", f"p{h}", "master", "br0")
            self._ns(self.switch, "ip", "link", "set", f"p{h}", "up")
            self._ns(ns, "ip", "link", "set", "lo", "up")
            self._ns(ns, "ip", "addr", "add", f"{self.addr(h)}/24", "dev", "eth0")
            self._ns(ns, "ip", "link", "set", "eth0", "up")
            self._shape(ns, "eth0")         # host -> switch
            self._shape(self.switch, f"p{h}")  # switch -> host

    def __exit__(self, *exc) -> None:
        for ns in [*self.names, self.switch]:
            _delete(ns)

    def exists(self) -> bool:
        """Whether any of this cluster's namespaces is still there."""
        have = _ip("netns", "list", check=False).stdout.split()
        return any(ns in have for ns in [*self.names, self.switch])

    def hosts_of(self, n: int, placement: Union[str, Sequence[int]]) -> List[int]:
        """The host of each of n ranks: "block" (ranks 0.. on host 0 first),
        "cyclic" (round robin, as srun -m cyclic), or an explicit list."""
        if placement == "block":
            per, extra = divmod(n, self.nhosts)
            hosts = [h for h in range(self.nhosts) for _ in range(per + (h < extra))]
        elif placement == "cyclic":
            hosts = [r % self.nhosts for r in range(n)]
        else:
            hosts = [int(h) for h in placement]
        if len(hosts) != n or any(not 0 <= h < self.nhosts for h in hosts):
            raise ValueError(f"placement {placement!r} does not fit {n} ranks on "
                             f"{self.nhosts} hosts")
        self.placement = hosts
        return hosts

    def rank_env(self, store_port: int) -> Callable[[int, int], dict]:
        """run_world's rank_env: rendezvous variables with the store on rank 0's host.
        No COLLECTIVES_LOCAL_*: ranks learn their hosts from the host ids."""
        placement = self.placement
        store = self.addr(placement[0])

        def env(rank: int, n: int) -> dict:
            return {"COLLECTIVES_RANK": rank, "COLLECTIVES_SIZE": n,
                    "COLLECTIVES_STORE_ADDR": f"{store}:{store_port}",
                    "MASTER_ADDR": store, "MASTER_PORT": store_port + 1,
                    "GLOO_SOCKET_IFNAME": "eth0", "NETNS_HOST": placement[rank]}
        return env

    def prefix(self, rank: int) -> List[str]:
        """The command words that start a rank inside its host: its network
        namespace, a UTS namespace of its own, the host's hostname."""
        h = self.placement[rank]
        return ["ip", "netns", "exec", self.names[h], "unshare", "--uts", "sh", "-c",
                f'hostname {self.hostname(h)} && exec "$@"', "rank"]
