"""Every public name of the public modules has a docstring (functions, classes, and the
public methods and properties of public classes)."""
import importlib
import inspect

import pytest

pytestmark = pytest.mark.timeout(60)

MODULES = ["collectives", "collectives.MPI", "collectives._core", "collectives.run",
           "collectives.launcher", "collectives.launcher.cli", "collectives.launcher.elastic_driver",
           "collectives.rendezvous", "collectives.rendezvous.env", "collectives.rendezvous.store",
           "collectives.rendezvous.auth", "collectives.elastic", "collectives.elastic.worker",
           "collectives.elastic.membership", "collectives.elastic.reform",
           "collectives.bench", "collectives.bench.driver",
           "collectives.bench.rows", "collectives.bench.turns", "collectives.bench.peers",
           "collectives.bench.sweep",
           "collectives.config",
           "collectives.rendezvous.world", "collectives.MPI._objects",
           "collectives.ps", "collectives.ps._wire", "collectives.ps._optim",
           "collectives.ps._server", "collectives.ps._client", "collectives.ps._links"]
# Adapters: checked where their framework is installed.
ADAPTERS = {"collectives.jax": "jax", "collectives.torch": "torch",
            "collectives.torch.mpi_ops": "torch", "collectives.torch.functions": "torch",
            "collectives.torch.optimizer": "torch", "collectives.torch.compression": "torch",
            "collectives.torch.distributed": "torch",
            "collectives.torch.distributed.backend": "torch", "collectives.torch.dgc": "torch",
            "collectives.torch.sparse_ops": "torch", "collectives.ps.torch": "torch"}


def _defined_here(mod, obj):
    owner = getattr(obj, "__module__", None)
    if owner is None:
        return False
    # Cython classes/functions report the extension module's name
    return owner == mod.__name__


def _missing(modname):
    mod = importlib.import_module(modname)
    missing = []
    if not (mod.__doc__ or "").strip():
        missing.append(modname)
    for name, obj in sorted(vars(mod).items()):
        if name.startswith("_"):
            continue
        if not (inspect.isclass(obj) or inspect.isroutine(obj)):
            continue
        if not _defined_here(mod, obj):
            continue
        if not (inspect.getdoc(obj) or "").strip():
            missing.append(f"{modname}.{name}")
        if inspect.isclass(obj):
            for attr, val in vars(obj).items():
                if attr.startswith("_"):
                    continue
                target = val.fget if isinstance(val, property) else val
                if isinstance(target, (staticmethod, classmethod)):
                    target = target.__func__
                if not (inspect.isroutine(target) or isinstance(val, property)
                        or type(val).__name__ in ("getset_descriptor", "member_descriptor")):
                    continue
                doc = getattr(val, "__doc__", None) if not isinstance(val, property) else \
                    (val.__doc__ or getattr(val.fget, "__doc__", None))
                if not (doc or "").strip():
                    missing.append(f"{modname}.{name}.{attr}")
    return missing


@pytest.mark.parametrize("modname", MODULES + sorted(ADAPTERS))
def test_public_names_have_docstrings(modname):
    if modname in ADAPTERS:
        pytest.importorskip(ADAPTERS[modname])
    missing = _missing(modname)
    assert not missing, "public names without a docstring:\n  " + "\n  ".join(missing)


def test_readme_env_table_is_generated_from_the_declarations():
    """The README's table is `python -m collectives.config`'s output."""
    import pathlib

    from collectives.config import markdown_table

    readme = (pathlib.Path(__file__).resolve().parent.parent / "README.md").read_text()
    assert markdown_table() in readme, "README.md's environment table is stale: regenerate it"
