"""The torch.distributed backend's errors, worded as torch's own backends word them.

A timed-out op raises the core's ``CollectivesError`` whose text starts
"rank 0: timed out ...". Scripts and PyTorch's own tests match gloo's text
instead (gloo: "... Timed out waiting 1000ms for recv operation to complete";
distributed_test.py: ``" (Timed out|closed|timeout) "``), so the backend
raises the same error (same class, same ``error_code``) with gloo's words in
front: "collectives backend: barrier: Timed out waiting 1000ms: rank 0: timed
out ...". Every other error passes through unchanged.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Optional

__all__ = ["worded", "wording_timeouts"]


def _timeout_code() -> int:
    from collectives import _core
    return {name: code for code, name in _core.ERR_NAMES.items()}["TIMEOUT"]


def worded(exc: BaseException, what: str, secs: Optional[float]) -> BaseException:
    """exc, or for a core timeout the same error with gloo's wording in front of its text.

    Args:
        exc: the error an op raised.
        what: the op ("barrier", "recv from rank 1").
        secs: the deadline the op had in seconds (None: the core's default).
    """
    from collectives._core import CollectivesError
    if not isinstance(exc, CollectivesError) or exc.error_code != _timeout_code() \
            or " Timed out " in str(exc):
        return exc
    waited = f"waiting {secs * 1000:.0f}ms" if secs is not None else \
        "waiting the core's timeout (COLLECTIVES_TIMEOUT)"
    new = CollectivesError(exc.error_code,
                           f"collectives backend: {what}: Timed out {waited}: {exc}")
    new.__cause__ = exc
    return new


def wording_timeouts(method: Callable, what: str) -> Callable:
    """method (of a ProcessGroupCollectives) raising its timeouts worded as gloo's."""
    @functools.wraps(method)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except Exception as exc:
            new = worded(exc, what, getattr(self, "_timeout", None))
            if new is exc:
                raise
            raise new from exc
    return call
