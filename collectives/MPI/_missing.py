"""The frameworks' names that collectives does not provide (yet), and the error for them.

A script ported from mpi4py or Horovod that reaches for one of these gets a
``NotImplementedError`` naming the missing API instead of a bare
``AttributeError``; a  that neither framework has is an ordinary
``AttributeError``. The error class is both, so ``hasattr`` and
``getattr(obj, name, default)`` keep working. The mpi4py lists are the public
names of mpi4py 4's ``MPI`` module and ``Intracomm`` (its ``MPI.pyi``) minus
what ``collectives.MPI`` has; a name implemented later is simply found before
``__getattr__`` is asked, so a stale entry here is harmless (tests/test_missing_api.py
checks the lists against mpi4py's stub when it is installed).
"""
from __future__ import annotations

# mpi4py: methods and attributes of MPI.Intracomm (and its bases) that collectives.MPI.Comm lacks.
MPI4PY_COMM = frozenset("""
    Accept Ack_failed Allgather_init Allgatherv_init Allreduce_init Alltoall_init
    Alltoallv_init Alltoallw Alltoallw_init Attach_buffer Barrier_init Bcast_init Bsend
    Bsend_init Call_errhandler Cart_map Clone Compare Connect Create_cart
    Create_dist_graph Create_dist_graph_adjacent Create_errhandler Create_from_group
    Create_graph Create_intercomm Create_keyval Delete_attr Detach_buffer
    Disconnect Dup_with_info Exscan_init Flush_buffer Free_keyval Gather_init Gatherv_init
    Get_attr Get_errhandler Get_failed Get_info Get_parent Get_topology Graph_map
    Iagree Ialltoallw Ibsend Idup Idup_with_info Iexscan Iflush_buffer
    Igather Igatherv Ireduce Irsend Is_revoked Iscan Iscatter
    Iscatterv Ishrink Join Precv_init     Psend_init Recv_init Reduce_init Reduce_scatter_block_init Reduce_scatter_init Revoke
    Rsend Rsend_init Scan_init Scatter_init Scatterv_init Send_init Set_attr Set_errhandler
    Set_info Spawn Spawn_multiple Split_type Ssend_init bsend f2py free fromhandle
    fromint handle ibsend info is_topo py2f     toint topology
""".split())

# mpi4py: module-level names of mpi4py.MPI that collectives.MPI lacks.
MPI4PY_MODULE = frozenset("""
    AINT APPNUM Add_error_class Add_error_code Add_error_string Aint_add Aint_diff Alloc_mem
    Attach_buffer BAND BFLOAT16_T BOOL BOR BOTTOM BSEND_OVERHEAD BUFFER_AUTOMATIC BXOR
    BottomType BufferAutomaticType CART CHARACTER COMBINER_CONTIGUOUS COMBINER_DARRAY
    COMBINER_DUP COMBINER_F90_COMPLEX COMBINER_F90_INTEGER COMBINER_F90_REAL COMBINER_HINDEXED
    COMBINER_HINDEXED_BLOCK COMBINER_HVECTOR COMBINER_INDEXED COMBINER_INDEXED_BLOCK
    COMBINER_NAMED COMBINER_RESIZED COMBINER_STRUCT COMBINER_SUBARRAY COMBINER_VALUE_INDEX
    COMBINER_VECTOR COMM_TYPE_HW_GUIDED COMM_TYPE_HW_UNGUIDED
    COMM_TYPE_RESOURCE_GUIDED COMM_TYPE_SHARED COMPLEX COMPLEX16 COMPLEX32 COMPLEX4 COMPLEX8
    CONGRUENT COUNT CXX_BOOL CXX_DOUBLE_COMPLEX CXX_FLOAT_COMPLEX CXX_LONG_DOUBLE_COMPLEX C_BOOL
    C_COMPLEX C_DOUBLE_COMPLEX C_FLOAT_COMPLEX C_LONG_DOUBLE_COMPLEX Cartcomm Close_port
    Compute_dims DATATYPE_NULL DISPLACEMENT_CURRENT DISP_CUR DISTRIBUTE_BLOCK DISTRIBUTE_CYCLIC
    DISTRIBUTE_DFLT_DARG DISTRIBUTE_NONE DIST_GRAPH DOUBLE_COMPLEX DOUBLE_INT DOUBLE_PRECISION
    Detach_buffer Distgraphcomm ERRHANDLER_NULL ERRORS_ABORT ERRORS_ARE_FATAL ERRORS_RETURN
    ERR_ABI ERR_ACCESS ERR_AMODE ERR_ARG ERR_ASSERT ERR_BAD_FILE ERR_BASE ERR_BUFFER ERR_COMM
    ERR_CONVERSION ERR_COUNT ERR_DIMS ERR_DISP ERR_DUP_DATAREP ERR_ERRHANDLER ERR_FILE
    ERR_FILE_EXISTS ERR_FILE_IN_USE ERR_GROUP ERR_INFO ERR_INFO_KEY ERR_INFO_NOKEY
    ERR_INFO_VALUE ERR_INTERN ERR_IN_STATUS ERR_IO ERR_KEYVAL ERR_LASTCODE ERR_LOCKTYPE ERR_NAME
    ERR_NOT_SAME ERR_NO_MEM ERR_NO_SPACE ERR_NO_SUCH_FILE ERR_OP ERR_OTHER ERR_PENDING ERR_PORT
    ERR_PROC_ABORTED ERR_PROC_FAILED ERR_PROC_FAILED_PENDING ERR_QUOTA ERR_RANK ERR_READ_ONLY
    ERR_REQUEST ERR_REVOKED ERR_RMA_ATTACH ERR_RMA_CONFLICT ERR_RMA_FLAVOR ERR_RMA_RANGE
    ERR_RMA_SHARED ERR_RMA_SYNC ERR_ROOT ERR_SERVICE ERR_SESSION ERR_SIZE ERR_SPAWN ERR_TAG
    ERR_TOPOLOGY ERR_TRUNCATE ERR_TYPE ERR_UNKNOWN ERR_UNSUPPORTED_DATAREP
    ERR_UNSUPPORTED_OPERATION ERR_VALUE_TOO_LARGE ERR_WIN Errhandler FILE_NULL FLOAT16_T
    FLOAT32_T FLOAT64_T FLOAT_INT F_BOOL F_COMPLEX F_DOUBLE F_DOUBLE_COMPLEX F_ERROR F_FLOAT
    F_FLOAT_COMPLEX F_INT F_SOURCE F_STATUS_SIZE F_TAG File Flush_buffer Free_mem GRAPH
    Get_abi_fortran_info Get_abi_info Get_abi_version Get_address
    Get_error_class Get_error_string Get_hw_resource_info Get_library_version Get_version
    Graphcomm Grequest IDENT INFO_ENV INFO_NULL INT16_T INTEGER INTEGER1 INTEGER16
    INTEGER2 INTEGER4 INTEGER8 INT_INT IO Iflush_buffer InPlaceType Info Init_thread Intercomm
    Intracomm Is_thread_main KEYVAL_INVALID LAND LASTUSEDCODE LOCK_EXCLUSIVE LOCK_SHARED LOGICAL
    LOGICAL1 LOGICAL16 LOGICAL2 LOGICAL4 LOGICAL8 LONG_DOUBLE LONG_DOUBLE_INT LONG_INT LOR LXOR
    Lookup_name MAXLOC MAX_DATAREP_STRING MAX_ERROR_STRING MAX_INFO_KEY MAX_INFO_VAL
    MAX_LIBRARY_VERSION_STRING MAX_OBJECT_NAME MAX_PORT_NAME MAX_PROCESSOR_NAME
    MAX_PSET_NAME_LEN MAX_STRINGTAG_LEN MINLOC MODE_APPEND
    MODE_CREATE MODE_DELETE_ON_CLOSE MODE_EXCL MODE_NOCHECK MODE_NOPRECEDE MODE_NOPUT
    MODE_NOSTORE MODE_NOSUCCEED MODE_RDONLY MODE_RDWR MODE_SEQUENTIAL MODE_UNIQUE_OPEN
    MODE_WRONLY NO_OP OFFSET OP_NULL ORDER_C ORDER_F ORDER_FORTRAN Open_port PACKED
    Pcontrol Pickle Prequest Publish_name Query_thread REAL REAL16 REAL2 REAL4 REAL8 REPLACE
    REQUEST_NULL ROOT Register_datarep Remove_error_class Remove_error_code Remove_error_string
    SEEK_CUR SEEK_END SEEK_SET SESSION_NULL SHORT SHORT_INT SIGNED_INT SIGNED_LONG
    SIGNED_LONG_LONG SIGNED_SHORT SIMILAR SINT16_T SINT32_T SINT64_T SINT8_T SUBVERSION SUCCESS
    Session THREAD_FUNNELED THREAD_MULTIPLE THREAD_SERIALIZED THREAD_SINGLE TWOINT
    TYPECLASS_COMPLEX TYPECLASS_INTEGER TYPECLASS_LOGICAL TYPECLASS_REAL Topocomm UINT16_T
    UINT32_T UINT64_T UNEQUAL UNIVERSE_SIZE UNSIGNED UNSIGNED_INT UNSIGNED_LONG
    UNSIGNED_LONG_LONG UNSIGNED_SHORT UNWEIGHTED Unpublish_name VERSION WCHAR WEIGHTS_EMPTY
    WIN_BASE WIN_CREATE_FLAVOR WIN_DISP_UNIT WIN_FLAVOR WIN_FLAVOR_ALLOCATE WIN_FLAVOR_CREATE
    WIN_FLAVOR_DYNAMIC WIN_FLAVOR_SHARED WIN_MODEL WIN_NULL WIN_SEPARATE WIN_SIZE WIN_UNIFIED
    WTIME_IS_GLOBAL Win buffer get_vendor memory
""".split())

# mpi4py: names of MPI.Request that collectives.MPI.Request lacks.
MPI4PY_REQUEST = frozenset("""
    Cancel Free Get_status_all Get_status_any Get_status_some cancel f2py free fromhandle
    fromint get_status_all get_status_any get_status_some handle py2f toint
""".split())

# horovod.torch (0.28): public names that collectives.torch lacks.
HOROVOD_TORCH: frozenset = frozenset()


class NotProvidedError(NotImplementedError, AttributeError):
    """A framework name that collectives does not provide (yet).

    A ``NotImplementedError`` for the reader, and an ``AttributeError`` so that
    ``hasattr()`` answers False and ``getattr(obj, name, default)`` works.
    """


def missing(owner: str, name: str, names: frozenset, framework: str,
            instance: bool = False) -> AttributeError:
    """The exception for attribute `name` of `owner` (a module such as "collectives.MPI",
    or with instance=True a class such as "collectives.MPI.Comm"): a NotProvidedError
    when `framework` ("mpi4py's MPI.Comm") has the name, else Python's AttributeError."""
    if name in names:
        return NotProvidedError(f"{owner}.{name} is not provided: collectives implements a "
                                f"subset of {framework}, and {name} is not in it (yet); "
                                f"see the README for what is")
    if instance:
        return AttributeError(f"{owner.rpartition('.')[2]!r} object has no attribute {name!r}")
    return AttributeError(f"module {owner!r} has no attribute {name!r}")
