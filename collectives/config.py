"""The declared COLLECTIVES_* tunables, as the core declares them (native/base/param.c).

``python -m collectives.config`` prints the Markdown table that the README
carries, so the README is generated from the one declaration.
"""
from __future__ import annotations

from typing import List, Tuple


def params() -> List[Tuple[str, str, str]]:
    """(name, default, description) of every tunable."""
    from ._core import params as _params

    return _params()


def markdown_table() -> str:
    """The README's environment-variable table."""
    lines = ["| variable | default | meaning |", "|---|---|---|"]
    for name, default, desc in params():
        lines.append(f"| `{name}` | {('`' + default + '`') if default else '—'} | {desc} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown_table())
