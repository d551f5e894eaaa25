"""What users install holds every module: the installed wheel against the source tree,
the sdist against the files a build and the tests need.

The wheel checks run where the suite tests an installed collectives (as CI
does, from a wheel built from the sdist); the sdist checks where
COLLECTIVES_DIST_DIR names the folder with the sdist and the wheel.
"""
import importlib
import importlib.metadata
import os
import tarfile
import zipfile
from pathlib import Path

import pytest

from conftest import FROM_SOURCE, REPO

pytestmark = pytest.mark.timeout(120)

PACKAGE = REPO / "collectives"
NATIVE_SUFFIXES = {".c", ".h", ".cc", ".cu", ".pyx", ".pxd", ".pxi"}
# Loaded at run time from inside the package: the JAX handler's sources,
# the extension's stub and the typing marker.
RUNTIME_FILES = ["collectives/_native/jax/ffi.cc", "collectives/_native/coll.h",
                 "collectives/_core.pyi", "collectives/py.typed"]


def _tree_modules() -> list:
    return sorted(str(p.relative_to(REPO)) for p in PACKAGE.rglob("*.py")
                  if "__pycache__" not in p.parts)


def _subpackages() -> list:
    return sorted(".".join(p.parent.relative_to(REPO).parts) for p in PACKAGE.rglob("__init__.py"))


def test_every_folder_of_the_package_is_a_package():
    # Package discovery (pyproject: packages.find) only takes folders with an
    # __init__.py: a folder of modules without one would be left out of the wheel.
    loose = sorted({str(p.parent.relative_to(REPO)) for p in PACKAGE.rglob("*.py")
                    if "__pycache__" not in p.parts and not (p.parent / "__init__.py").is_file()})
    assert not loose, f"folders of modules that are not packages (no __init__.py): {loose}"
    assert "collectives.torch" in _subpackages() and "collectives.bench" in _subpackages()


def _installed_files() -> set:
    files = importlib.metadata.files("collectives") or []
    return {str(f).replace(os.sep, "/") for f in files}


@pytest.mark.skipif(FROM_SOURCE, reason="checks an installed wheel; the suite is testing the "
                                         "checkout (CI installs the wheel and runs this)")
def test_the_installed_wheel_holds_every_module_and_runtime_file():
    installed = _installed_files()
    missing = [m for m in _tree_modules() + RUNTIME_FILES if m not in installed]
    assert not missing, f"in the source tree but not in the installed wheel: {missing}"
    assert any(f.startswith("collectives/_core.") and f.endswith(".so") for f in installed), \
        "the native extension is not in the wheel"
    for name in _subpackages():
        if name.startswith("collectives.torch"):
            pytest.importorskip("torch")
        mod = importlib.import_module(name)
        assert Path(mod.__file__).resolve().is_relative_to(Path(importlib.import_module(
            "collectives").__file__).resolve().parent), f"{name} imported from {mod.__file__}"
    scripts = {e.name for e in importlib.metadata.entry_points(group="console_scripts")
               if e.value.startswith("collectives")}
    assert {"collectives-run", "collectives-bench"} <= scripts


def _dist(pattern: str) -> Path:
    folder = os.environ.get("COLLECTIVES_DIST_DIR")
    if not folder:
        pytest.skip("COLLECTIVES_DIST_DIR is not set (CI sets it to the folder of the built "
                    "sdist and wheel)")
    found = sorted(Path(folder).glob(pattern))
    assert len(found) == 1, f"expected one {pattern} in {folder}, found {found}"
    return found[0]


def test_the_sdist_holds_what_a_build_and_the_tests_need():
    sdist = _dist("collectives-*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    need = ["LICENSE", "README.md", "ARCHITECTURE.md", "pyproject.toml", "setup.py", "MANIFEST.in",
            "tests/conftest.py", "tests/_worker.py"]
    need += [str(p.relative_to(REPO)) for p in (REPO / "native").rglob("*")
             if p.suffix in NATIVE_SUFFIXES and p.name != "_core.c"]
    need += [str(p.relative_to(REPO)) for p in (REPO / "examples").glob("*.py")]
    need += [str(p.relative_to(REPO)) for p in (REPO / "tests").glob("test_*.py")]
    need += [str(p.relative_to(REPO)) for p in (REPO / "bench").iterdir() if p.is_file()]
    need += _tree_modules()
    missing = sorted(set(need) - names)
    assert not missing, f"missing from {sdist.name}: {missing}"


def test_the_wheel_file_carries_the_license_and_every_module():
    wheel = _dist("collectives-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), sorted(names)[:20]
    missing = [m for m in _tree_modules() + RUNTIME_FILES if m not in names]
    assert not missing, f"missing from {wheel.name}: {missing}"
