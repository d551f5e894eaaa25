"""Print a Kubernetes Secret holding a fresh job secret, for the examples' manifests.

    python -m collectives.launcher.k8s_secret my-job-secret | kubectl apply -f -

Every pod of the job mounts it (``defaultMode: 0400``) and points
``COLLECTIVES_JOB_SECRET_FILE`` at the mounted key (examples/*.yaml). The key
is 256 random bits as 64 hex digits (collectives/rendezvous/auth.py); it is
written to stdout only, never to a file or the command line.
"""
from __future__ import annotations

import argparse
import base64
import re
import sys
from typing import Optional

from ..rendezvous.auth import generate_secret

__all__ = ["KEY", "manifest", "main"]

KEY = "job-secret"  # the file name the key gets where the Secret is mounted
# A Kubernetes object name: a DNS-1123 subdomain.
_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def manifest(name: str, namespace: Optional[str] = None, secret: Optional[str] = None) -> str:
    """The YAML of a Secret `name` (in `namespace`) whose key KEY holds `secret` (default:
    a fresh one).

    Raises:
        ValueError: `name` or `namespace` is not a valid Kubernetes name.
    """
    for what, value in (("name", name), ("namespace", namespace)):
        if value is not None and (len(value) > 253 or not _NAME.fullmatch(value)):
            raise ValueError(f"{what} {value!r} is not a Kubernetes object name (lower-case "
                             f"letters, digits, '-' and '.')")
    data = base64.b64encode((secret or generate_secret()).encode()).decode()
    lines = ["apiVersion: v1", "kind: Secret", "metadata:", f"  name: {name}"]
    if namespace:
        lines.append(f"  namespace: {namespace}")
    lines += ["type: Opaque", "data:", f"  {KEY}: {data}"]
    return "\n".join(lines) + "\n"


def main(argv: Optional[list] = None) -> int:
    """Entry point: print the manifest; exit code 2 on a bad name."""
    p = argparse.ArgumentParser(prog="python -m collectives.launcher.k8s_secret",
                                description="Print a Kubernetes Secret with a fresh job secret.")
    p.add_argument("name", help="the Secret's name (the manifests in examples/ use "
                                "collectives-job-secret)")
    p.add_argument("-n", "--namespace", default=None)
    args = p.parse_args(argv)
    try:
        sys.stdout.write(manifest(args.name, args.namespace))
    except ValueError as exc:
        p.error(str(exc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
