"""Horovod's environment variables, declared once: what each means here, checked on read.

Every ``HOROVOD_*`` variable a Horovod job may set is one row of ``KNOBS``:
name, default, allowed values, and what ``collectives.torch`` does with it
(honoured, mapped onto our own, or accepted and ignored, with the reason).
``check_env()`` runs at ``hvd.init()``: a value outside what the row allows
is a ``ValueError`` naming the variable, on every rank, before anything is
sent (as the ``COLLECTIVES_*`` variables, ``collectives.config``).
``python -m collectives.torch._knobs`` prints the README's table.
"""
from __future__ import annotations

import os
from typing import Callable, Mapping, NamedTuple, Optional

__all__ = ["KNOBS", "check_env", "cycle_time_s", "cache_capacity", "stall_times",
           "log_level", "markdown_table", "flag", "autotune", "autotune_settings", "Settings",
           "explicit"]


class Knob(NamedTuple):
    """One HOROVOD_* variable: its default, the values allowed, what it does here."""

    name: str
    default: str
    allowed: str
    meaning: str


def _number(lo: float, hi: Optional[float] = None, integer: bool = False) -> Callable:
    def check(name: str, text: str) -> float:
        try:
            value = int(text) if integer else float(text)
        except ValueError:
            raise ValueError(f"{name}={text!r} is not {'an integer' if integer else 'a number'}"
                             ) from None
        if value != value or value < lo or (hi is not None and value > hi):
            upper = f" and <= {hi:g}" if hi is not None else ""
            raise ValueError(f"{name}={text!r}: must be >= {lo:g}{upper}")
        return value
    return check


def _flag(name: str, text: str) -> bool:
    if text.strip().lower() in ("1", "true", "yes", "on"):
        return True
    if text.strip().lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{name}={text!r}: must be 0 or 1")


def _level(name: str, text: str) -> str:
    levels = ("trace", "debug", "info", "warning", "error", "fatal")
    if text.strip().lower() not in levels:
        raise ValueError(f"{name}={text!r}: must be one of {', '.join(levels)}")
    return text.strip().lower()


def _free(name: str, text: str) -> str:
    return text


KNOBS = [
    Knob("HOROVOD_CYCLE_TIME", "1", "milliseconds >= 0",
         "honoured: the negotiation cycle (new ops are agreed at most this often)"),
    Knob("HOROVOD_CACHE_CAPACITY", "1024", "integer >= 0",
         "honoured: response-cache entries (0: every op negotiated in full)"),
    Knob("HOROVOD_FUSION_THRESHOLD", "134217728", "bytes (integer) >= 0",
         "mapped: `COLLECTIVES_FUSION_THRESHOLD` when that is unset (fused allreduces and "
         "`DistributedOptimizer` buckets)"),
    Knob("HOROVOD_STALL_CHECK_DISABLE", "0", "0 or 1", "honoured: no stall warnings"),
    Knob("HOROVOD_STALL_CHECK_TIME_SECONDS", "60", "seconds >= 0",
         "honoured: rank 0 warns about an op some ranks submitted and others not, naming "
         "them"),
    Knob("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "0", "seconds >= 0",
         "honoured: such an op then fails on the ranks that submitted it (0: after "
         "`COLLECTIVES_TIMEOUT`, so no wait is unbounded)"),
    Knob("HOROVOD_TIMELINE", "", "a file path",
         "honoured: rank 0 writes a Chrome trace (`COLLECTIVES_TIMELINE` wins)"),
    Knob("HOROVOD_TIMELINE_MARK_CYCLES", "0", "0 or 1", "ignored: cycles are not marked"),
    Knob("HOROVOD_LOG_LEVEL", "warning", "trace, debug, info, warning, error, fatal",
         "honoured: level of the `collectives.torch` logger (stall warnings are `warning`)"),
    Knob("HOROVOD_GLOO_TIMEOUT_SECONDS", "", "seconds > 0",
         "mapped: `COLLECTIVES_TIMEOUT` when that is unset (every collective's deadline)"),
    Knob("HOROVOD_START_TIMEOUT", "", "seconds > 0",
         "mapped: `COLLECTIVES_START_TIMEOUT` when that is unset (rendezvous deadline)"),
    Knob("HOROVOD_HIERARCHICAL_ALLREDUCE", "0", "0 or 1",
         "ignored: `algorithm=\"auto\"` already goes two-level when hosts run several ranks "
         "(see Topology)"),
    Knob("HOROVOD_HIERARCHICAL_ALLGATHER", "0", "0 or 1",
         "ignored: as HOROVOD_HIERARCHICAL_ALLREDUCE"),
    Knob("HOROVOD_AUTOTUNE", "0", "0 or 1",
         "honoured: rank 0 tunes the fusion threshold and cycle time online (Bayesian "
         "optimisation of bytes allreduced per second), every rank applying each point in "
         "the same negotiation round; an explicitly set threshold or cycle time stays fixed"),
    Knob("HOROVOD_AUTOTUNE_LOG", "", "a file path",
         "honoured: rank 0 writes Horovod's CSV, a row per scored sample (score: bytes/s) "
         "and a last row with the best point"),
    Knob("HOROVOD_AUTOTUNE_WARMUP_SAMPLES", "3", "integer >= 0",
         "honoured: samples discarded before scoring"),
    Knob("HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", "10", "integer >= 1",
         "honoured: steps per scoring window (a sample is the median of 5 windows)"),
    Knob("HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", "20", "integer 1..1000",
         "honoured: scored samples (+1) before the best point is fixed"),
    Knob("HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", "0.8", "number 0..100",
         "honoured: the Gaussian process's noise, on standardised scores"),
    Knob("HOROVOD_DYNAMIC_PROCESS_SETS", "0", "0 or 1",
         "honoured: `add_process_set`/`remove_process_set` after init"),
    Knob("HOROVOD_GLOO_IFACE", "", "an interface name",
         "mapped: `COLLECTIVES_IFNAME` when that is unset"),
    Knob("HOROVOD_CPU_OPERATIONS", "", "gloo, mpi, ccl", "ignored: one implementation"),
    Knob("HOROVOD_CONTROLLER", "", "gloo, mpi", "ignored: one implementation"),
]

_CHECKS = {
    "HOROVOD_CYCLE_TIME": _number(0.0, 10_000.0),
    "HOROVOD_CACHE_CAPACITY": _number(0, 1 << 20, integer=True),
    "HOROVOD_FUSION_THRESHOLD": _number(0, 1 << 40, integer=True),
    "HOROVOD_STALL_CHECK_DISABLE": _flag,
    "HOROVOD_STALL_CHECK_TIME_SECONDS": _number(0.0),
    "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": _number(0.0),
    "HOROVOD_TIMELINE": _free,
    "HOROVOD_TIMELINE_MARK_CYCLES": _flag,
    "HOROVOD_LOG_LEVEL": _level,
    "HOROVOD_GLOO_TIMEOUT_SECONDS": _number(1e-3),
    "HOROVOD_START_TIMEOUT": _number(1e-3),
    "HOROVOD_HIERARCHICAL_ALLREDUCE": _flag,
    "HOROVOD_HIERARCHICAL_ALLGATHER": _flag,
    "HOROVOD_AUTOTUNE": _flag,
    "HOROVOD_AUTOTUNE_LOG": _free,
    "HOROVOD_AUTOTUNE_WARMUP_SAMPLES": _number(0, 100_000, integer=True),
    "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE": _number(1, 1_000_000, integer=True),
    "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": _number(1, 1000, integer=True),
    "HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE": _number(0.0, 100.0),
    "HOROVOD_DYNAMIC_PROCESS_SETS": _flag,
    "HOROVOD_GLOO_IFACE": _free,
    "HOROVOD_CPU_OPERATIONS": _free,
    "HOROVOD_CONTROLLER": _free,
}
# Horovod's variable -> ours, set from it when ours is unset (before the rendezvous reads it)
MAPPED = {"HOROVOD_GLOO_TIMEOUT_SECONDS": "COLLECTIVES_TIMEOUT",
          "HOROVOD_START_TIMEOUT": "COLLECTIVES_START_TIMEOUT",
          "HOROVOD_GLOO_IFACE": "COLLECTIVES_IFNAME",
          "HOROVOD_FUSION_THRESHOLD": "COLLECTIVES_FUSION_THRESHOLD"}


def _read(name: str, environ: Optional[Mapping[str, str]] = None) -> object:
    env = os.environ if environ is None else environ
    text = env.get(name, "").strip()
    if not text:
        default = next(k.default for k in KNOBS if k.name == name)
        return _CHECKS[name](name, default) if default else None
    return _CHECKS[name](name, text)


def check_env(environ: Optional[Mapping[str, str]] = None) -> None:
    """ValueError naming the first HOROVOD_* variable whose value its row does not allow."""
    env = os.environ if environ is None else environ
    for knob in KNOBS:
        if env.get(knob.name, "").strip():
            _CHECKS[knob.name](knob.name, env[knob.name].strip())


def apply_mapped() -> None:
    """Set each of our variables that a Horovod one maps onto, where ours is unset."""
    check_env()
    for theirs, ours in MAPPED.items():
        text = os.environ.get(theirs, "").strip()
        if text and not os.environ.get(ours, "").strip():
            os.environ[ours] = text
    if os.environ.get("HOROVOD_LOG_LEVEL", "").strip():
        import logging

        levels = {"trace": logging.DEBUG, "debug": logging.DEBUG, "info": logging.INFO,
                  "warning": logging.WARNING, "error": logging.ERROR, "fatal": logging.CRITICAL}
        logging.getLogger("collectives.torch").setLevel(levels[log_level()])


def cycle_time_s() -> float:
    """HOROVOD_CYCLE_TIME in seconds (default 1 ms, Horovod's)."""
    return float(_read("HOROVOD_CYCLE_TIME")) / 1000.0  # type: ignore[arg-type]


def flag(name: str) -> bool:
    """A 0-or-1 HOROVOD_* variable (its default when unset)."""
    return bool(_read(name))


def autotune() -> bool:
    """HOROVOD_AUTOTUNE: tune the fusion threshold and cycle time (see _autotune)."""
    return flag("HOROVOD_AUTOTUNE")


class Settings(NamedTuple):
    """The autotuner's HOROVOD_AUTOTUNE_* settings (see _autotune)."""

    warmups: int = 3
    steps_per_sample: int = 10
    max_samples: int = 20
    noise: float = 0.8
    log_path: str = ""


def autotune_settings() -> Settings:
    """The autotuner's settings from HOROVOD_AUTOTUNE_*."""
    return Settings(int(_read("HOROVOD_AUTOTUNE_WARMUP_SAMPLES")),  # type: ignore[arg-type]
                    int(_read("HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE")),  # type: ignore[arg-type]
                    int(_read("HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES")),  # type: ignore
                    float(_read("HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE")),  # type: ignore
                    str(_read("HOROVOD_AUTOTUNE_LOG") or ""))


def explicit(name: str) -> bool:
    """True if HOROVOD_FUSION_THRESHOLD or HOROVOD_CYCLE_TIME is set by the user (the
    fusion threshold also through COLLECTIVES_FUSION_THRESHOLD, which it maps onto):
    the autotuner leaves such a value as it is."""
    ours = MAPPED.get(name)
    return bool(os.environ.get(name, "").strip() or
                (ours is not None and os.environ.get(ours, "").strip()))


def cache_capacity() -> int:
    """HOROVOD_CACHE_CAPACITY (default 1024, Horovod's; 0 disables the cache)."""
    return int(_read("HOROVOD_CACHE_CAPACITY"))  # type: ignore[arg-type]


def stall_times(default_expire: float) -> tuple[float, float]:
    """(warn after, fail after) in seconds; warn 0 = never. Failing defaults to
    `default_expire` (the collective timeout) so that no op waits without a deadline."""
    warn = 0.0 if _read("HOROVOD_STALL_CHECK_DISABLE") else \
        float(_read("HOROVOD_STALL_CHECK_TIME_SECONDS"))  # type: ignore[arg-type]
    expire = float(_read("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"))  # type: ignore[arg-type]
    return warn, (expire if expire > 0 else default_expire)


def collective_timeout() -> float:
    """COLLECTIVES_TIMEOUT in seconds (the core's default, 300, when unset or unreadable:
    the core reports a bad value itself)."""
    try:
        value = float(os.environ.get("COLLECTIVES_TIMEOUT", "") or 300.0)
    except ValueError:
        return 300.0
    return value if value > 0 and value == value else 300.0


def log_level() -> str:
    """HOROVOD_LOG_LEVEL, lower case."""
    return str(_read("HOROVOD_LOG_LEVEL"))


def markdown_table() -> str:
    """The README's table of Horovod's variables."""
    lines = ["| variable | default | allowed | here |", "|---|---|---|---|"]
    for k in KNOBS:
        lines.append(f"| `{k.name}` | {('`' + k.default + '`') if k.default else '—'} | "
                     f"{k.allowed} | {k.meaning} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown_table())
