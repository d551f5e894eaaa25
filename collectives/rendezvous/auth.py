"""The per-job secret, the keys derived from it, and the WARN line for what is dropped.

Every rank of a job holds the same secret, which never travels through the
store or over a link: ``collectives-run`` generates one and hands it to its
ranks in ``COLLECTIVES_JOB_SECRET``; under torchrun, mpirun or srun the user
sets that variable, or ``COLLECTIVES_JOB_SECRET_FILE`` (a path, e.g. on a
shared file system for a multi-host job). From it two keys are derived, one
for the store (collectives/rendezvous/store.py: a challenge-response when a client
connects, then an HMAC on every request and reply) and one for the links
(native/auth.h: a challenge-response in every link's opening, an HMAC on
every abort notice).

Without a secret the same protocol runs with an empty one, so it
authenticates nothing: the rank says so once (WARN), or refuses to start
when ``COLLECTIVES_REQUIRE_AUTH=1``.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import socket
import sys
import threading
import time
from typing import Optional

__all__ = ["job_secret", "store_key", "link_key", "mac", "warn", "MIN_SECRET_BYTES",
           "generate_secret", "encrypt_wanted"]

SECRET_VAR = "COLLECTIVES_JOB_SECRET"
SECRET_FILE_VAR = "COLLECTIVES_JOB_SECRET_FILE"
REQUIRE_VAR = "COLLECTIVES_REQUIRE_AUTH"
# A shorter secret is refused: it could be guessed from one recorded handshake.
MIN_SECRET_BYTES = 16
_MAX_SECRET_BYTES = 4096

_warned_unauthenticated = False
_warn_lock = threading.RLock()
_last_warn: dict = {}


def generate_secret() -> str:
    """A fresh secret for one job (256 random bits, as 64 hex digits)."""
    import secrets
    return secrets.token_hex(32)


def _truthy(text: Optional[str]) -> bool:
    return (text or "").strip().lower() in ("1", "true", "yes", "on")


def _read_secret_file(path: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            data = fh.read(_MAX_SECRET_BYTES + 1)
            mode = os.fstat(fh.fileno()).st_mode
    except OSError as exc:
        raise ValueError(f"{SECRET_FILE_VAR}={path!r} cannot be read: {exc.strerror}") from None
    if len(data) > _MAX_SECRET_BYTES:
        raise ValueError(f"{SECRET_FILE_VAR}={path!r} is over {_MAX_SECRET_BYTES} bytes; "
                         f"a job secret is one line")
    if mode & 0o077:
        warn(f"{SECRET_FILE_VAR}={path!r} can be read by other users (mode "
             f"{mode & 0o777:o}); chmod 600 it", key="secret-file-mode")
    return data.strip()


# The rank variables of the launchers env.detect() knows, in its order: the first
# one set says which process of the job this is.
_RANK_VARS = ("COLLECTIVES_RANK", "RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID",
              "PMI_RANK")


def _launcher_rank() -> Optional[int]:
    for name in _RANK_VARS:
        text = os.environ.get(name, "").strip()
        if text:
            try:
                return int(text)
            except ValueError:
                return None
    return None


def job_secret(rank: Optional[int] = None) -> bytes:
    """This job's secret as bytes; b"" when none is set (warned once per job).

    Args:
        rank: this process's rank in the job, when the caller knows it (else read
            from the launcher's variables): without a secret, only rank 0 (or a
            process no launcher started) warns, so a job of n ranks warns once,
            not n times.

    Raises:
        ValueError: the secret is shorter than MIN_SECRET_BYTES, its file
            cannot be read, or none is set and COLLECTIVES_REQUIRE_AUTH=1.
    """
    global _warned_unauthenticated
    text = os.environ.get(SECRET_VAR)
    path = os.environ.get(SECRET_FILE_VAR)
    if text:
        secret = text.strip().encode()
        where = SECRET_VAR
    elif path:
        secret = _read_secret_file(path)
        where = f"{SECRET_FILE_VAR}={path!r}"
    else:
        if _truthy(os.environ.get(REQUIRE_VAR)):
            raise ValueError(f"{REQUIRE_VAR}=1 but neither {SECRET_VAR} nor {SECRET_FILE_VAR} "
                             f"is set: give every rank the same job secret (collectives-run "
                             f"does this itself)")
        if rank is None:
            rank = _launcher_rank()
        with _warn_lock:
            if not _warned_unauthenticated and rank in (None, 0):
                _warned_unauthenticated = True
                warn(f"no {SECRET_VAR} or {SECRET_FILE_VAR}: this job is unauthenticated, "
                     f"anyone who can reach the store or a rank's port can read the job's "
                     f"addresses, join it or inject data (set {REQUIRE_VAR}=1 to refuse; "
                     f"set a secret as the README's Security section shows; said by rank 0 "
                     f"only)", key="unauthenticated")
        return b""
    if len(secret) < MIN_SECRET_BYTES:
        raise ValueError(f"the job secret from {where} is {len(secret)} bytes; at least "
                         f"{MIN_SECRET_BYTES} are needed (e.g. `openssl rand -hex 32`)")
    return secret


def _derive(secret: bytes, purpose: bytes) -> bytes:
    return hmac.new(secret, b"collectives v1 " + purpose, hashlib.sha256).digest()


def store_key(secret: bytes) -> bytes:
    """The 32-byte key of the store's handshake and request MACs."""
    return _derive(secret, b"store")


ENCRYPT_VAR = "COLLECTIVES_ENCRYPT"


def encrypt_wanted() -> bool:
    """COLLECTIVES_ENCRYPT=1: this rank encrypts its TCP links (native/transport/crypt.h)."""
    return os.environ.get(ENCRYPT_VAR, "").strip() == "1"


def link_key(secret: bytes) -> bytes:
    """The 32-byte key of link openings and abort notices (given to the core), and the
    input of each encrypted connection's keys.

    Raises:
        ValueError: COLLECTIVES_ENCRYPT=1 without a job secret (keys derived from an
            empty secret would hide nothing from whoever reads the link).
    """
    if encrypt_wanted() and not secret:
        raise ValueError(f"{ENCRYPT_VAR}=1 needs a job secret: the links' keys are derived "
                         f"from it; set {SECRET_VAR} or {SECRET_FILE_VAR} on every rank "
                         f"(collectives-run sets one itself)")
    return _derive(secret, b"link")


def mac(key: bytes, *parts: bytes) -> bytes:
    """HMAC-SHA256 of the concatenated parts."""
    h = hmac.new(key, digestmod=hashlib.sha256)
    for part in parts:
        h.update(part)
    return h.digest()


def warn(message: str, key: Optional[str] = None, every: float = 10.0) -> None:
    """One WARN line on stderr, "host:pid COLLECTIVES WARN message", as the core writes them.

    With ``key``, at most one line per ``every`` seconds for that key: what a
    hostile peer can trigger at will cannot flood the log.
    """
    if key is not None:
        now = time.monotonic()
        with _warn_lock:
            last = _last_warn.get(key)
            if last is not None and now - last < every:
                return
            _last_warn[key] = now
    try:
        sys.stderr.write(f"{socket.gethostname()}:{os.getpid()} COLLECTIVES WARN {message}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
