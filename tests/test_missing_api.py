"""Framework names that collectives does not provide (yet) say so, by name.

mpi4py's and Horovod's names missing here raise NotImplementedError (which is
also an AttributeError, so hasattr() stays False); names neither framework has
raise a plain AttributeError. The mpi4py lists are checked against mpi4py's
own type stub, both ways, when mpi4py is installed.
"""
from __future__ import annotations

import ast
import importlib.util
import os

import pytest

from collectives import MPI
from collectives.MPI import _missing
from collectives._core import Communicator


@pytest.fixture(scope="module")
def comm():
    """A one-rank MPI.Comm over its own core (no rendezvous)."""
    core = Communicator(0, 1)
    yield MPI.Comm._from_core(core, 0, 1)
    core.close()


def _raises_not_provided(get, qualified: str, framework: str) -> None:
    with pytest.raises(NotImplementedError) as info:
        get()
    text = str(info.value)
    assert text.startswith(f"{qualified} is not provided: collectives implements a subset of "
                           f"{framework}"), text
    assert isinstance(info.value, AttributeError)


@pytest.mark.parametrize("name", ["send", "recv", "Split", "Dup", "Reduce", "Scatterv",
                                  "Sendrecv", "Create_cart"])
def test_missing_comm_method_names_the_mpi4py_api(comm, name) -> None:
    if name in dir(type(comm)):  # implemented since: then it must simply be there
        assert callable(getattr(comm, name))
        return
    _raises_not_provided(lambda: getattr(comm, name), f"collectives.MPI.Comm.{name}",
                         "mpi4py's MPI.Comm")
    assert not hasattr(comm, name)


@pytest.mark.parametrize("name", ["COMM_NULL", "ANY_SOURCE", "Status", "LAND", "Intracomm",
                                  "Get_version"])
def test_missing_module_name_names_the_mpi4py_api(name) -> None:
    if name in vars(MPI) or name in MPI.__all__:  # implemented since: then it is there
        assert getattr(MPI, name) is not None
        return
    _raises_not_provided(lambda: getattr(MPI, name), f"collectives.MPI.{name}", "mpi4py's MPI")
    assert getattr(MPI, name, "default") == "default"


def test_missing_request_names_the_mpi4py_api(comm) -> None:
    """On the class (Request.Cancel) and on a request alike."""
    req = comm.isend(1, MPI.PROC_NULL)
    req.Wait()
    for owner in (MPI.Request, req):
        _raises_not_provided(lambda: owner.Cancel, "collectives.MPI.Request.Cancel",
                             "mpi4py's MPI.Request")
        assert not hasattr(owner, "Free")
        with pytest.raises(AttributeError) as info:
            owner.Canccel
        assert not isinstance(info.value, NotImplementedError)


def test_names_no_framework_has_are_plain_attribute_errors(comm) -> None:
    for get, text in ((lambda: comm.sendd, "'Comm' object has no attribute 'sendd'"),
                      (lambda: MPI.COMM_SELFF,
                       "module 'collectives.MPI' has no attribute 'COMM_SELFF'")):
        with pytest.raises(AttributeError) as info:
            get()
        assert not isinstance(info.value, NotImplementedError)
        assert str(info.value) == text


def test_missing_horovod_names() -> None:
    hvd = pytest.importorskip("collectives.torch")
    for name in sorted(_missing.HOROVOD_TORCH):  # none left: hvd.elastic was the last
        _raises_not_provided(lambda: getattr(hvd, name), f"collectives.torch.{name}",
                             "horovod.torch")
    assert callable(hvd.elastic.run) and hvd.elastic.TorchState
    with pytest.raises(AttributeError) as info:
        hvd.no_such_name
    assert not isinstance(info.value, NotImplementedError)
    # what is provided is not in the list (the list says what is missing)
    assert not _missing.HOROVOD_TORCH & set(hvd.__all__)


def _mpi4py_stub():
    spec = importlib.util.find_spec("mpi4py")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("mpi4py is not installed: its stub is the reference for these lists")
    path = os.path.join(list(spec.submodule_search_locations)[0], "MPI.pyi")
    if not os.path.exists(path):
        pytest.skip("this mpi4py has no MPI.pyi")
    tree = ast.parse(open(path).read())
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}

    def names(body) -> set:
        out = set()
        for s in body:
            if isinstance(s, (ast.FunctionDef, ast.ClassDef)):
                out.add(s.name)
            elif isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name):
                out.add(s.target.id)
            elif isinstance(s, ast.Assign):
                out |= {t.id for t in s.targets if isinstance(t, ast.Name)}
        return {n for n in out if not n.startswith("_")}

    def members(cls: str) -> set:
        node = classes[cls]
        inherited = set()
        for base in node.bases:
            if isinstance(base, ast.Name) and base.id in classes:
                inherited |= members(base.id)
        return inherited | names(node.body)
    return names(tree.body), members("Intracomm"), members("Request")


def test_mpi4py_lists_match_mpi4py(comm) -> None:
    """Every mpi4py name we lack is listed (no bare AttributeError), and every listed
    name is mpi4py's (no invented API)."""
    module, intracomm, request = _mpi4py_stub()
    ours_request = set(dir(MPI.Request))
    assert request - ours_request <= _missing.MPI4PY_REQUEST, \
        request - ours_request - _missing.MPI4PY_REQUEST
    assert _missing.MPI4PY_REQUEST <= request, _missing.MPI4PY_REQUEST - request
    assert not _missing.MPI4PY_REQUEST & ours_request, _missing.MPI4PY_REQUEST & ours_request
    ours_comm = set(dir(type(comm)))
    assert intracomm - ours_comm <= _missing.MPI4PY_COMM, intracomm - ours_comm - _missing.MPI4PY_COMM
    assert _missing.MPI4PY_COMM <= intracomm, _missing.MPI4PY_COMM - intracomm
    ours_module = set(vars(MPI)) | {"COMM_WORLD", "COMM_SELF"}  # made on first use
    assert module - ours_module <= _missing.MPI4PY_MODULE, module - ours_module - _missing.MPI4PY_MODULE
    assert _missing.MPI4PY_MODULE <= module, _missing.MPI4PY_MODULE - module
    # and nothing listed as missing is provided (a stale entry would hide nothing,
    # but would tell a reader the name is not there)
    assert not _missing.MPI4PY_COMM & ours_comm, _missing.MPI4PY_COMM & ours_comm
    assert not _missing.MPI4PY_MODULE & ours_module, _missing.MPI4PY_MODULE & ours_module
