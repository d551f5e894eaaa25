"""The environment that gives a started process the package's `torch.backends` entry
point (tests/test_torch_autoload.py, tests/test_frameworks.py).

Testing an install, pip wrote it: nothing to add. Testing the checkout (built in
place, no metadata of its own), a directory on PYTHONPATH holds the
``entry_points.txt`` that pip writes from pyproject.toml's declaration, read from it.
"""
import pytest

from conftest import FROM_SOURCE, REPO, base_env


def declared() -> str:
    """pyproject.toml's `torch.backends` entry point of the package ("module:function")."""
    try:
        import tomllib
    except ImportError:  # Python < 3.11
        tomllib = pytest.importorskip("tomli")
    with open(REPO / "pyproject.toml", "rb") as fh:
        project = tomllib.load(fh)["project"]
    return project["entry-points"]["torch.backends"]["collectives"]


def autoload_env(tmp_path) -> dict:
    """Extra environment for run_world/base_env: the installed entry point."""
    if not FROM_SOURCE:
        return {}
    info = tmp_path / "collectives_autoload-0.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: collectives-autoload\n"
                                   "Version: 0\n")
    (info / "entry_points.txt").write_text(f"[torch.backends]\ncollectives = {declared()}\n")
    return {"PYTHONPATH": f"{tmp_path}:{base_env()['PYTHONPATH']}"}
