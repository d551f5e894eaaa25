"""The declared COLLECTIVES_* tunables, as the core declares them (native/base/param.c).

Each declaration carries its name, default, description and allowed values;
:func:`check_env` applies the allowed values to the environment before the
rendezvous, so a value the core would ignore or misread (``COLLECTIVES_TRANSPORT=
infiniband``, ``COLLECTIVES_SHM_BYTES=3M``, ``COLLECTIVES_TIMEOUT=0``) is a
``ValueError`` naming the variable and what it accepts, on every rank, before
any connection. ``python -m collectives.config`` prints the Markdown table that
the README carries, so the README is generated from the one declaration.
"""
from __future__ import annotations

import math
import os
import re
from typing import Callable, Dict, List, Mapping, Optional, Tuple

from .rendezvous.env import byte_size, parse_addr

Check = Callable[[str, str], None]


def params() -> List[Tuple[str, str, str, str]]:
    """(name, default, description, allowed values) of every tunable."""
    from ._core import params as _params

    return _params()


def markdown_table() -> str:
    """The README's environment-variable table."""
    lines = ["| variable | default | allowed | meaning |", "|---|---|---|---|"]
    for name, default, desc, allowed in params():
        shown = ('`' + default + '`') if default else '—'
        lines.append(f"| `{name}` | {shown} | {allowed} | {desc} |")
    return "\n".join(lines)


def _choices(allowed: str, items: str, is_list: bool) -> Check:
    names = [c.strip() for c in items.split(",")]
    lower = {c.lower() for c in names}

    def check(name: str, text: str) -> None:
        values = text.split(",") if is_list else [text]
        bad = [v.strip() for v in values if v.strip().lower() not in lower]
        if bad:
            what = "a comma-separated list of" if is_list else "one of"
            raise ValueError(f"{name}={text!r} is not {what} {', '.join(names)}")
    return check


def _number(allowed: str, unit: str, strict: bool, auto: bool) -> Check:
    def check(name: str, text: str) -> None:
        if auto and text.strip().lower() == "auto":
            return
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < 0 or (strict and value == 0):
            reason = "not a number of" if math.isnan(value) else "out of range for"
            raise ValueError(f"{name}={text!r} is {reason} {unit}: allowed: {allowed}")
    return check


def _bytes(allowed: str, pow2: bool, positive: bool, lo: Optional[str], hi: Optional[str],
           auto: bool) -> Check:
    low = byte_size("lower bound", lo) if lo else 0
    high = byte_size("upper bound", hi) if hi else None

    def check(name: str, text: str) -> None:
        if auto and text.strip().lower() == "auto":
            return
        try:
            value = byte_size(name, text)
        except ValueError as exc:
            raise ValueError(f"{exc}; allowed: {allowed}") from None
        if (positive and value == 0) or value < low or (high is not None and value > high) or \
                (pow2 and value & (value - 1)):
            raise ValueError(f"{name}={text!r} ({value} bytes) is not allowed: {allowed}")
    return check


def _integer(allowed: str, minimum: int, maximum: Optional[int] = None) -> Check:
    def check(name: str, text: str) -> None:
        try:
            value = int(text.strip())
        except ValueError:
            raise ValueError(f"{name}={text!r} is not an integer: allowed: {allowed}") from None
        if value < minimum or (maximum is not None and value > maximum):
            raise ValueError(f"{name}={value} is out of range: allowed: {allowed}")
    return check


def _address(name: str, text: str) -> None:
    try:
        parse_addr(text)
    except ValueError as exc:
        raise ValueError(f"{name}: {exc}") from None


def _free(name: str, text: str) -> None:
    """Any text: checked where it is used (a path is opened, an interface looked up)."""


def checker(allowed: str) -> Check:
    """The check(name, text) that one declaration's allowed-values text describes
    (grammar: native/param.c); ValueError for a text outside the grammar."""
    m = re.fullmatch(r"(one|list) of: (.+)", allowed)
    if m:
        return _choices(allowed, m.group(2), m.group(1) == "list")
    m = re.fullmatch(r"(seconds|microseconds) (>|>=) 0(, or auto)?", allowed)
    if m:
        return _number(allowed, m.group(1), m.group(2) == ">", bool(m.group(3)))
    m = re.fullmatch(r"(power-of-two )?bytes( > 0)?(?:, (\w+) to (\w+))?(, or auto)?", allowed)
    if m:
        return _bytes(allowed, bool(m.group(1)), bool(m.group(2)), m.group(3), m.group(4),
                      bool(m.group(5)))
    m = re.fullmatch(r"integer >= (\d+)", allowed)
    if m:
        return _integer(allowed, int(m.group(1)))
    m = re.fullmatch(r"integer, (\d+) to (\d+)", allowed)
    if m:
        return _integer(allowed, int(m.group(1)), int(m.group(2)))
    if allowed == "host:port":
        return _address
    if allowed.startswith(("a ", "an ")):
        return _free
    raise ValueError(f"cannot read the allowed values {allowed!r}")


# COLLECTIVES_* variables read by the Python side alone (the launcher, the tests and
# the timeline), which the core does not declare: not misspellings.
OTHER_VARS = {
    "COLLECTIVES_TIMELINE": "collectives.torch: write a Chrome-trace timeline to this file",
    "COLLECTIVES_FAILURE_DIR": "set by collectives-run: where a rank that failed says which "
                               "rank its failure began at (the launcher names that rank)",
    "COLLECTIVES_TEST_INSTALLED": "tests: 1 refuses to test the checkout instead of an install",
    "COLLECTIVES_TEST_REQUIRE": "tests: frameworks that must import (torch,jax)",
    "COLLECTIVES_TEST_ENV": "tests: NAME=VALUE,... given to every process the tests start",
    "COLLECTIVES_DIST_DIR": "tests: the directory of the sdist and wheel to check",
    "COLLECTIVES_FUZZ_SECONDS": "tests: how long the fuzz tests run",
    "COLLECTIVES_FUZZ_SEED": "tests: the fuzz tests' seed",
}

_checks: Optional[Dict[str, Check]] = None
_warned_unknown: set = set()


def unknown_vars(environ: Mapping[str, str]) -> List[Tuple[str, Optional[str]]]:
    """(name, closest declared name or None) for every set COLLECTIVES_* variable that
    nothing reads: a misspelling (an S too many) would otherwise be ignored silently."""
    import difflib

    declared = [name for name, _, _, _ in params()]
    known = set(declared) | set(OTHER_VARS)
    # Compared without the prefix, which every candidate shares.
    tails = {name[len("COLLECTIVES_"):]: name for name in declared + list(OTHER_VARS)}
    out = []
    for name in sorted(environ):
        if name.startswith("COLLECTIVES_") and name not in known:
            close = difflib.get_close_matches(name[len("COLLECTIVES_"):], list(tails), n=1,
                                              cutoff=0.6)
            out.append((name, tails[close[0]] if close else None))
    return out


def _warn_unknown(environ: Mapping[str, str]) -> None:
    from .rendezvous import auth

    if auth._launcher_rank() not in (None, 0):  # once per job: rank 0 says it
        return
    for name, close in unknown_vars(environ):
        if name in _warned_unknown:
            continue
        _warned_unknown.add(name)
        hint = f"; did you mean {close}?" if close else " (python -m collectives.config lists them)"
        auth.warn(f"{name} is set but is not a variable collectives reads: ignored{hint}")


def check_env(environ: Optional[Mapping[str, str]] = None, warn_unknown: bool = True) -> None:
    """ValueError, naming the variable and its allowed values, for the first set
    COLLECTIVES_* tunable whose value its declaration does not allow.

    An empty value means the default (as the core reads it). Called by
    ``collectives.init()`` and ``collectives-run`` before any connection. A
    COLLECTIVES_* variable that is set but declared nowhere is warned about once
    (by rank 0), naming the closest declared variable, unless warn_unknown is
    False (the launcher: its rank 0 warns).
    """
    global _checks
    if _checks is None:
        _checks = {name: checker(allowed) for name, _, _, allowed in params()}
    env = os.environ if environ is None else environ
    for name, check in _checks.items():
        text = env.get(name, "")
        if text.strip():
            check(name, text)
    if warn_unknown:
        _warn_unknown(env)


if __name__ == "__main__":
    print(markdown_table())
