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


_checks: Optional[Dict[str, Check]] = None


def check_env(environ: Optional[Mapping[str, str]] = None) -> None:
    """ValueError, naming the variable and its allowed values, for the first set
    COLLECTIVES_* tunable whose value its declaration does not allow.

    An empty value means the default (as the core reads it). Called by
    ``collectives.init()`` and ``collectives-run`` before any connection.
    """
    global _checks
    if _checks is None:
        _checks = {name: checker(allowed) for name, _, _, allowed in params()}
    env = os.environ if environ is None else environ
    for name, check in _checks.items():
        text = env.get(name, "")
        if text.strip():
            check(name, text)


if __name__ == "__main__":
    print(markdown_table())
