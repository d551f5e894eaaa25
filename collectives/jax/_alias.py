"""Which operands of collectives.jax's custom calls may share their output's buffer.

Issue 21: inside ``jax.jit`` an output aliased to an argument the caller keeps
makes XLA copy that argument into a fresh buffer before the call, which costs
more than the allreduce itself at 64 MiB. collectives.jax asks ``caller_keeps``
at lowering time and drops the alias for such operands (the handler then
writes its own output out of place).
"""
from __future__ import annotations

from jax.extend.mlir import ir


def caller_keeps(value) -> bool:
    """True when `value` is an argument of the jitted function that the caller keeps (not donated).

    XLA must copy such an input before an aliased custom call writes over it,
    into a freshly allocated buffer: a full extra pass over memory, page faults
    included (issue 21: 2.5x the numpy path at 64 MiB). Without the alias the
    handler writes its fresh output directly (the core's out-of-place form
    reads the input once and never copies it). Anything else -- an
    intermediate, a donated argument, a loop-carried value -- keeps the alias:
    XLA reuses the buffer when the value dies there and adds the copy only
    when it does not (correct either way).
    """
    arg = value.maybe_downcast()
    if not isinstance(arg, ir.BlockArgument):
        return False
    func = arg.owner.owner
    if func is None or func.operation.name != "func.func":
        return False
    attrs = func.operation.attributes
    if "arg_attrs" not in attrs:
        return True
    arg_attrs = ir.DictAttr(ir.ArrayAttr(attrs["arg_attrs"])[arg.arg_number])
    return not any(k in arg_attrs for k in ("tf.aliasing_output", "jax.buffer_donor"))
