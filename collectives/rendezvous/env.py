"""Where this process sits in the job: rank, size, local rank and store address.

The first of these sources that is present wins:

1. ``COLLECTIVES_RANK``/``COLLECTIVES_SIZE`` (+ ``COLLECTIVES_LOCAL_RANK``,
   ``COLLECTIVES_LOCAL_SIZE``, ``COLLECTIVES_STORE_ADDR``), set by
   ``collectives-run``.
2. torchrun: ``RANK`` and ``WORLD_SIZE`` (+ ``LOCAL_RANK``,
   ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``). torchrun's elastic
   agent already hosts its own TCPStore on ``MASTER_PORT``, so our store listens
   on ``MASTER_PORT + 1``.
3. OpenMPI: ``OMPI_COMM_WORLD_RANK`` (+ ``_SIZE``, ``_LOCAL_RANK``,
   ``_LOCAL_SIZE``). The store address comes from ``MASTER_ADDR``/``MASTER_PORT``
   when set, otherwise it defaults to ``127.0.0.1`` (right only for single-host
   jobs; set ``COLLECTIVES_STORE_ADDR`` for multi-host ``mpirun``) and a port
   derived from the job id, so that all ranks agree without talking.
4. Slurm: ``SLURM_PROCID`` (+ ``SLURM_NTASKS``, ``SLURM_LOCALID``). The store
   host is the first node of ``SLURM_JOB_NODELIST`` and the port is derived from
   ``SLURM_JOB_ID``, unless ``MASTER_ADDR``/``MASTER_PORT`` are set.
5. Nothing: a single process (rank 0 of 1, no store).

``COLLECTIVES_STORE_ADDR`` ("host:port", IPv6 as "[::1]:port") overrides the
store address whatever the source. Nothing here opens a connection except
:func:`advertise_address`, which only connects a UDP socket (sends nothing).
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import socket
import struct
import zlib
from dataclasses import dataclass
from typing import Mapping, Optional

__all__ = [
    "WorldInfo",
    "detect",
    "parse_addr",
    "format_addr",
    "expand_hostlist",
    "derived_port",
    "interface_address",
    "advertise_address",
]

# Ports derived from a job id fall in 20000..39999: above the registered
# services most clusters run. The range overlaps Linux's ephemeral ports
# (32768+), so a collision is possible but rare, and it fails loudly (the
# store cannot bind) rather than silently.
_PORT_BASE = 20000
_PORT_SPAN = 20000

_SIOCGIFADDR = 0x8915  # Linux ioctl: IPv4 address of an interface


@dataclass(frozen=True)
class WorldInfo:
    """Rank, size, placement and store address of this process.

    ``store_host``/``store_port`` are None only when ``size == 1``.
    ``source`` is one of "collectives", "torchrun", "openmpi", "slurm",
    "single".
    """

    rank: int
    size: int
    local_rank: Optional[int]
    local_size: Optional[int]
    store_host: Optional[str]
    store_port: Optional[int]
    source: str


# ---------------------------------------------------------------- addresses


def parse_addr(text: str) -> tuple[str, int]:
    """Split "host:port", "1.2.3.4:port" or "[v6addr]:port" into (host, port).

    Raises:
        ValueError: if the text has no port, the port is not an integer in
            1..65535, or an IPv6 address is not in brackets.
    """
    text = text.strip()
    if text.startswith("["):
        close = text.find("]")
        if close < 0 or not text[close + 1 :].startswith(":"):
            raise ValueError(f"bad address {text!r}: expected '[ipv6]:port'")
        host, port_text = text[1:close], text[close + 2 :]
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep:
            raise ValueError(f"bad address {text!r}: expected 'host:port'")
        if ":" in host:
            raise ValueError(
                f"bad address {text!r}: write IPv6 addresses as '[addr]:port'"
            )
    if not host:
        raise ValueError(f"bad address {text!r}: empty host")
    return host, _parse_port(port_text, f"address {text!r}")


def format_addr(host: str, port: int) -> str:
    """Join host and port, bracketing IPv6 literals: ("::1", 80) -> "[::1]:80"."""
    if ":" in host and not host.startswith("["):
        return f"[{host}]:{port}"
    return f"{host}:{port}"


def _parse_port(text: str, what: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise ValueError(f"bad port {text!r} in {what}: not an integer") from None
    if not 0 < port < 65536:
        raise ValueError(f"bad port {port} in {what}: must be in 1..65535")
    return port


def derived_port(job_id: str) -> int:
    """A port in 20000..39999 computed from a job id, the same on every rank."""
    return _PORT_BASE + zlib.crc32(job_id.encode()) % _PORT_SPAN


# ------------------------------------------------------------ slurm hostlist


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside [...]."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"bad hostlist {text!r}: unbalanced ']'")
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"bad hostlist {text!r}: unbalanced '['")
    parts.append(text[start:])
    return [p for p in (s.strip() for s in parts) if p]


def _expand_range_set(body: str, whole: str) -> list[str]:
    """"01-03,07" -> ["01", "02", "03", "07"], keeping zero padding."""
    out: list[str] = []
    for item in body.split(","):
        lo, sep, hi = item.strip().partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"bad hostlist {whole!r}: bad range {item!r}")
        if not sep:
            out.append(lo)
            continue
        if int(hi) < int(lo):
            raise ValueError(f"bad hostlist {whole!r}: descending range {item!r}")
        width = len(lo)  # Slurm pads to the width of the lower bound
        out.extend(str(n).zfill(width) for n in range(int(lo), int(hi) + 1))
    return out


def expand_hostlist(text: str) -> list[str]:
    """Expand a Slurm hostlist: "node[01-03,07],gpu3" -> node01..node03, node07, gpu3.

    Several bracket groups in one name expand as a product, in Slurm's order
    ("r[1-2]n[1-2]" -> r1n1, r1n2, r2n1, r2n2).
    """
    hosts: list[str] = []
    for part in _split_top_level(text):
        names = [""]
        rest = part
        while rest:
            open_ = rest.find("[")
            if open_ < 0:
                names = [n + rest for n in names]
                break
            close = rest.find("]", open_)
            prefix, body, rest = rest[:open_], rest[open_ + 1 : close], rest[close + 1 :]
            names = [n + prefix + v for n in names for v in _expand_range_set(body, text)]
        hosts.extend(names)
    return hosts


def _simple_tasks_per_node(text: str) -> Optional[int]:
    """"4" or "4(x3)" or "4,4" -> 4; uneven lists like "2(x3),1" -> None."""
    counts = set()
    for item in text.split(","):
        item = item.strip()
        base = item.split("(", 1)[0]
        if not base.isdigit():
            return None
        counts.add(int(base))
    return counts.pop() if len(counts) == 1 else None


# -------------------------------------------------------------- env readers

_BYTES = re.compile(r"(\d+)(?:([kmg])(?:i?b)?|b)?", re.IGNORECASE)


def byte_size(name: str, text: str) -> int:
    """Variable `name`'s byte count as the core reads it: digits with an optional K, M or G
    (binary: "4M", "512k", "4MiB", "65536"); ValueError naming the variable otherwise."""
    m = _BYTES.fullmatch(text.strip())
    if not m:
        raise ValueError(f"{name}={text!r} is not a number of bytes (like 4M, 512K or 65536)")
    return int(m.group(1)) << {"": 0, "k": 10, "m": 20, "g": 30}[(m.group(2) or "").lower()]


def _int_var(env: Mapping[str, str], name: str, minimum: int = 0) -> int:
    text = env.get(name)
    if text is None:
        raise ValueError(f"{name} is not set")
    try:
        value = int(text.strip())
    except ValueError:
        raise ValueError(f"{name}={text!r} is not an integer") from None
    if value < minimum:
        raise ValueError(f"{name}={value} must be >= {minimum}")
    return value


def _opt_int_var(env: Mapping[str, str], name: str, minimum: int = 0) -> Optional[int]:
    return _int_var(env, name, minimum) if env.get(name, "").strip() else None


def _master_addr(env: Mapping[str, str], port_offset: int = 0) -> Optional[tuple[str, int]]:
    """MASTER_ADDR/MASTER_PORT as a store address, or None when either is unset."""
    host = env.get("MASTER_ADDR", "").strip()
    port_text = env.get("MASTER_PORT", "").strip()
    if not host or not port_text:
        return None
    port = _parse_port(port_text, "MASTER_PORT") + port_offset
    if port > 65535:
        raise ValueError(f"MASTER_PORT={port_text} leaves no room for port MASTER_PORT+1")
    return host.strip("[]"), port


def _check(info: WorldInfo, rank_var: str, size_var: str, local_vars: tuple[str, str],
           store_var: str) -> WorldInfo:
    if info.size < 1:
        raise ValueError(f"{size_var}={info.size} must be >= 1")
    if info.rank >= info.size:
        raise ValueError(f"{rank_var}={info.rank} must be < {size_var}={info.size}")
    if info.local_rank is not None and info.local_size is not None:
        if info.local_rank >= info.local_size:
            raise ValueError(
                f"{local_vars[0]}={info.local_rank} must be < "
                f"{local_vars[1]}={info.local_size}"
            )
    if info.size > 1 and (info.store_host is None or info.store_port is None):
        raise ValueError(
            f"{store_var} is not set: a job of {info.size} processes needs a store "
            "address (set COLLECTIVES_STORE_ADDR=host:port)"
        )
    return info


def detect(environ: Optional[Mapping[str, str]] = None) -> WorldInfo:
    """Read rank, size, local rank and store address from the environment.

    Args:
        environ: the variables to read; ``os.environ`` when None.

    Returns:
        A :class:`WorldInfo` from the first source present (see module doc).

    Raises:
        ValueError: naming the variable, when a value is not an integer, a
            rank is not below its size, or a job of more than one process
            has no store address.
    """
    env = os.environ if environ is None else environ
    override = None
    if env.get("COLLECTIVES_STORE_ADDR", "").strip():
        try:
            override = parse_addr(env["COLLECTIVES_STORE_ADDR"])
        except ValueError as exc:
            raise ValueError(f"COLLECTIVES_STORE_ADDR: {exc}") from None

    def build(rank: int, size: int, local_rank: Optional[int], local_size: Optional[int],
              store: Optional[tuple[str, int]], source: str) -> WorldInfo:
        store = override or store
        host, port = store if store else (None, None)
        return WorldInfo(rank, size, local_rank, local_size, host, port, source)

    if "COLLECTIVES_RANK" in env or "COLLECTIVES_SIZE" in env:
        info = build(
            _int_var(env, "COLLECTIVES_RANK"),
            _int_var(env, "COLLECTIVES_SIZE", 1),
            _opt_int_var(env, "COLLECTIVES_LOCAL_RANK"),
            _opt_int_var(env, "COLLECTIVES_LOCAL_SIZE", 1),
            None,
            "collectives",
        )
        return _check(info, "COLLECTIVES_RANK", "COLLECTIVES_SIZE",
                      ("COLLECTIVES_LOCAL_RANK", "COLLECTIVES_LOCAL_SIZE"),
                      "COLLECTIVES_STORE_ADDR")

    if "RANK" in env and "WORLD_SIZE" in env:
        # +1: torchrun's agent already listens on MASTER_PORT with its own store.
        info = build(
            _int_var(env, "RANK"),
            _int_var(env, "WORLD_SIZE", 1),
            _opt_int_var(env, "LOCAL_RANK"),
            _opt_int_var(env, "LOCAL_WORLD_SIZE", 1),
            None if override else _master_addr(env, port_offset=1),
            "torchrun",
        )
        return _check(info, "RANK", "WORLD_SIZE", ("LOCAL_RANK", "LOCAL_WORLD_SIZE"),
                      "MASTER_ADDR/MASTER_PORT")

    if "OMPI_COMM_WORLD_RANK" in env:
        store = None if override else _master_addr(env)
        if store is None and not override:
            job = next((env[k] for k in ("OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE",
                                         "OMPI_MCA_orte_ess_jobid") if env.get(k)), None)
            if job is not None:
                store = ("127.0.0.1", derived_port(job))
        info = build(
            _int_var(env, "OMPI_COMM_WORLD_RANK"),
            _int_var(env, "OMPI_COMM_WORLD_SIZE", 1),
            _opt_int_var(env, "OMPI_COMM_WORLD_LOCAL_RANK"),
            _opt_int_var(env, "OMPI_COMM_WORLD_LOCAL_SIZE", 1),
            store,
            "openmpi",
        )
        return _check(info, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                      ("OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
                      "COLLECTIVES_STORE_ADDR (or MASTER_ADDR/MASTER_PORT, or an "
                      "OpenMPI job id)")

    if "SLURM_PROCID" in env:
        store = None if override else _master_addr(env)
        if store is None and not override:
            nodes = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or ""
            job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
            if nodes.strip() and job:
                try:
                    first = expand_hostlist(nodes)[0]
                except (ValueError, IndexError) as exc:
                    raise ValueError(f"SLURM_JOB_NODELIST: {exc}") from None
                store = (first, derived_port(job))
        local_size = None
        per_node = env.get("SLURM_NTASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
        if per_node:
            local_size = _simple_tasks_per_node(per_node)
        info = build(
            _int_var(env, "SLURM_PROCID"),
            _int_var(env, "SLURM_NTASKS", 1),
            _opt_int_var(env, "SLURM_LOCALID"),
            local_size,
            store,
            "slurm",
        )
        return _check(info, "SLURM_PROCID", "SLURM_NTASKS",
                      ("SLURM_LOCALID", "SLURM_TASKS_PER_NODE"),
                      "COLLECTIVES_STORE_ADDR (or SLURM_JOB_NODELIST and SLURM_JOB_ID)")

    return build(0, 1, 0, 1, None, "single")


# --------------------------------------------------------------- interfaces


def _ipv4_of(ifname: str) -> Optional[str]:
    """IPv4 address of an interface via SIOCGIFADDR; None if it has none."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            req = struct.pack("256s", ifname.encode()[:15])
            res = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, req)
        except OSError as exc:
            if exc.errno in (errno.EADDRNOTAVAIL, errno.ENODEV):
                return None
            raise
    return socket.inet_ntoa(res[20:24])  # struct ifreq: name[16], sockaddr_in


def _ipv6_of(ifname: str) -> Optional[str]:
    """An IPv6 address of an interface from /proc/net/if_inet6.

    Link-local addresses (scope 0x20) are returned, with "%ifname", only when
    the interface has nothing else.
    """
    global_addrs, link_local = [], []
    try:
        with open("/proc/net/if_inet6", encoding="ascii") as fh:
            for line in fh:
                fields = line.split()
                if len(fields) < 6 or fields[5] != ifname:
                    continue
                raw = bytes.fromhex(fields[0])
                addr = socket.inet_ntop(socket.AF_INET6, raw)
                if int(fields[3], 16) == 0x20:
                    link_local.append(f"{addr}%{ifname}")
                else:
                    global_addrs.append(addr)
    except FileNotFoundError:
        return None
    if global_addrs:
        return global_addrs[0]
    return link_local[0] if link_local else None


def interface_address(ifname: str, family: Optional[int] = None) -> str:
    """The address of network interface ``ifname`` ("lo" -> "127.0.0.1").

    Args:
        ifname: interface name as in ``ip link``.
        family: ``socket.AF_INET`` or ``socket.AF_INET6``; None tries IPv4
            then IPv6.

    Raises:
        ValueError: the interface does not exist (the message lists the known
            ones) or has no address of the requested family.
    """
    known = [name for _, name in socket.if_nameindex()]
    if ifname not in known:
        raise ValueError(
            f"unknown network interface {ifname!r} (COLLECTIVES_IFNAME); "
            f"this host has: {', '.join(known)}"
        )
    if family not in (None, socket.AF_INET, socket.AF_INET6):
        raise ValueError(f"unsupported address family {family!r}")
    addr = None
    if family in (None, socket.AF_INET):
        addr = _ipv4_of(ifname)
    if addr is None and family in (None, socket.AF_INET6):
        addr = _ipv6_of(ifname)
    if addr is None:
        kind = {socket.AF_INET: "IPv4 ", socket.AF_INET6: "IPv6 "}.get(family, "")
        raise ValueError(f"network interface {ifname!r} has no {kind}address")
    return addr


def _family_of(host: str, port: int) -> int:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    except socket.gaierror:
        return socket.AF_INET6 if ":" in host else socket.AF_INET
    return infos[0][0]


def advertise_address(store_host: Optional[str], store_port: Optional[int],
                      ifname: Optional[str] = None,
                      environ: Optional[Mapping[str, str]] = None) -> str:
    """The local address that peers should use to reach this process.

    The address of ``ifname`` (or of ``COLLECTIVES_IFNAME``) when given;
    otherwise the local address the kernel would route from towards the store
    (a UDP socket is connected, no packet is sent); otherwise 127.0.0.1, or
    ::1 when the store is IPv6.
    """
    env = os.environ if environ is None else environ
    ifname = ifname or env.get("COLLECTIVES_IFNAME", "").strip() or None
    family = _family_of(store_host, store_port or 1) if store_host else socket.AF_INET
    if ifname:
        try:
            return interface_address(ifname, family)
        except ValueError:
            return interface_address(ifname)  # other family rather than nothing
    loopback = "::1" if family == socket.AF_INET6 else "127.0.0.1"
    if not store_host:
        return loopback
    try:
        infos = socket.getaddrinfo(store_host, store_port or 1, type=socket.SOCK_DGRAM)
    except socket.gaierror:
        return loopback
    for fam, kind, proto, _, sockaddr in infos:
        try:
            with socket.socket(fam, kind, proto) as sock:
                sock.connect(sockaddr)  # UDP: picks a route, sends nothing
                return sock.getsockname()[0]
        except OSError:
            continue
    return loopback
