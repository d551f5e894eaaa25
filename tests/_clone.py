"""Where a user stands after the README's install: the clone's root, with the package
installed (tests/test_readme_commands.py, tests/test_ray.py).

Testing an install (COLLECTIVES_TEST_INSTALLED=1, CI), that is the checkout itself,
whose collectives/ has no built core. Testing the checkout (built in place), it is a
copy of the clone without any built extension, with the checkout standing in for the
installed package (on PYTHONPATH, after the clone's root as site-packages would be).
"""
import os
import shutil
import sys

from conftest import FROM_SOURCE, REPO, base_env

# `-S` keeps site's .pth files out, so that an editable install of another checkout
# (whose import hook would serve `collectives._core` to any collectives/) cannot hide
# a clone that fails; site-packages itself is then on PYTHONPATH, after the checkout.
PYTHON_FLAGS = ["-S"] if FROM_SOURCE else []


def user_clone(tmp_path_factory):
    """(root, env) of a user who cloned and installed; run `python` with PYTHON_FLAGS."""
    env = base_env({"OMP_NUM_THREADS": "1"})
    if not FROM_SOURCE:
        env["PYTHONPATH"] = ""  # the installed package only
        return REPO, env
    root = tmp_path_factory.mktemp("clone")
    for name in ("README.md", "pyproject.toml"):
        shutil.copy(REPO / name, root / name)
    skip = shutil.ignore_patterns("*.so", "__pycache__", "*.pyc", "build")
    for name in ("collectives", "tests", "examples", "bench"):
        shutil.copytree(REPO / name, root / name, ignore=skip)
    assert not list((root / "collectives").glob("_core*.so")), "the clone copy has a built core"
    sites = [p for p in sys.path if os.path.basename(p) in ("site-packages", "dist-packages")]
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + sites)
    return root, env
