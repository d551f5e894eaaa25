"""JAX's runtime tokens after a failed collective (used by collectives.jax).

JAX hands the token a program returned to the next program with an ordered
effect. When a collective failed, that token holds the error, and the next
program fails with the old error before its collective runs; but only where
the token had already resolved, so one rank skipped a collective that the
others ran (seen: "collectives called in a different order"). Here a failed
collective's error reaches the caller through its outputs only: the next
program starts from a fresh token, runs its collective and reports its own
outcome, the same on every rank (an error all ranks agreed on leaves the
communicator usable; a broken one fails every later call naming the cause).
JAX has no public way to reset a runtime token: this patches the private
``RuntimeTokenSet.get_token_input``, for one effect type only.
"""
from typing import Any

from jax._src import dispatch as _jax_dispatch


def _failed(token: Any) -> bool:
    """Whether a finished program left this runtime token in error (never blocks)."""
    buf = getattr(token, "_buf", None)
    if buf is None or not buf.is_ready():
        return False
    try:
        buf.block_until_ready()
    except Exception:
        return True
    return False


def fresh_token_after_failure(effect_type: type) -> None:
    """Make programs with an `effect_type` effect start from a fresh token when the
    last one failed (idempotent)."""
    tokens = _jax_dispatch.RuntimeTokenSet
    original = tokens.get_token_input
    if getattr(original, "_collectives_effect", None) is effect_type:
        return

    def get_token_input(self, eff, devices):
        if isinstance(eff, effect_type) and _failed(self.current_tokens.get(eff)):
            del self.current_tokens[eff]
        return original(self, eff, devices)

    get_token_input._collectives_effect = effect_type
    tokens.get_token_input = get_token_input
