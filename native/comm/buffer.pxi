# buffer.pxi -- one path from any buffer-like object to one C view
# (pointer, bytes, dtype, element count, read-only flag). Nothing downstream
# knows where a buffer came from.
#
# Accepted: PEP 3118 exporters (numpy, bytearray, memoryview, array.array),
# CPU objects with __dlpack__ (PyTorch, JAX) through numpy.from_dlpack, which
# shares their memory, and GPU buffers: __cuda_array_interface__ (CuPy,
# PyTorch, Numba, JAX) or a CUDA __dlpack__ capsule, read in place. A GPU view
# also carries the stream the producer queued its work on (the interface's
# "stream", else the legacy default stream): the collective runs after it.

cimport cython
from cpython.buffer cimport (PyBUF_C_CONTIGUOUS, PyBUF_FORMAT, PyBUF_WRITABLE,
                             PyBuffer_Release, PyObject_CheckBuffer, PyObject_GetBuffer)
from cpython.pycapsule cimport PyCapsule_GetPointer, PyCapsule_IsValid
from libc.stdint cimport int32_t, int64_t, uint16_t, uint32_t, uint64_t, uintptr_t
cimport numpy as cnp

cnp.import_array()

cdef extern from *:
    """
    #define COLL_LITTLE_ENDIAN (__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__)
    """
    bint COLL_LITTLE_ENDIAN

cdef extern from *:
    """
    /* DLPack's C structs (dlpack.h, ABI stable since 0.6). */
    typedef struct { int device_type; int32_t device_id; } coll_DLDevice;
    typedef struct { uint8_t code; uint8_t bits; uint16_t lanes; } coll_DLDataType;
    typedef struct {
      void *data; coll_DLDevice device; int32_t ndim; coll_DLDataType dtype;
      int64_t *shape; int64_t *strides; uint64_t byte_offset;
    } coll_DLTensor;
    typedef struct coll_DLManagedTensor {
      coll_DLTensor dl_tensor; void *manager_ctx; void (*deleter)(struct coll_DLManagedTensor *);
    } coll_DLManagedTensor;
    """
    ctypedef struct coll_DLDevice:
        int device_type
        int32_t device_id
    ctypedef struct coll_DLDataType:
        uint8_t code
        uint8_t bits
        uint16_t lanes
    ctypedef struct coll_DLTensor:
        void *data
        coll_DLDevice device
        int32_t ndim
        coll_DLDataType dtype
        int64_t *shape
        int64_t *strides
        uint64_t byte_offset
    ctypedef struct coll_DLManagedTensor:
        coll_DLTensor dl_tensor

cdef extern from *:
    """
    /* DLPack 1.0's versioned tensor (capsule "dltensor_versioned"). */
    typedef struct { uint32_t major; uint32_t minor; } coll_DLPackVersion;
    typedef struct {
      coll_DLPackVersion version; void *manager_ctx; void (*deleter)(void *);
      uint64_t flags; coll_DLTensor dl_tensor;
    } coll_DLManagedTensorVersioned;
    #define COLL_DLPACK_FLAG_READ_ONLY 1ULL
    """
    ctypedef struct coll_DLPackVersion:
        uint32_t major
        uint32_t minor
    ctypedef struct coll_DLManagedTensorVersioned:
        coll_DLPackVersion version
        uint64_t flags
        coll_DLTensor dl_tensor
    uint64_t COLL_DLPACK_FLAG_READ_ONLY

DTYPES = {
    "int8": COLL_INT8, "uint8": COLL_UINT8, "int32": COLL_INT32, "int64": COLL_INT64,
    "float16": COLL_FLOAT16, "bfloat16": COLL_BFLOAT16, "float32": COLL_FLOAT32,
    "float64": COLL_FLOAT64,
}
OPS = {"sum": COLL_SUM, "prod": COLL_PROD, "min": COLL_MIN, "max": COLL_MAX, "avg": COLL_AVG}
ALGORITHMS = {"auto": COLL_ALGO_AUTO, "ring": COLL_ALGO_RING, "tree": COLL_ALGO_TREE,
              "butterfly": COLL_ALGO_BUTTERFLY, "two_level": COLL_ALGO_TWO_LEVEL}


cdef int char_dtype(char c, Py_ssize_t itemsize) noexcept:
    """The dtype code of one struct-module type character (numpy's dtype.char
    is the same alphabet) whose elements are itemsize bytes, or -1 if
    unsupported or the size disagrees."""
    cdef int code = -1
    if c == b"b":
        code = COLL_INT8
    elif c == b"B" or c == b"c":
        code = COLL_UINT8
    elif c == b"i" or c == b"l" or c == b"q" or c == b"n":
        code = COLL_INT32 if itemsize == 4 else COLL_INT64
    elif c == b"e":
        code = COLL_FLOAT16
    elif c == b"f":
        code = COLL_FLOAT32
    elif c == b"d":
        code = COLL_FLOAT64
    elif c == b"E":  # ml_dtypes' bfloat16 exports this
        code = COLL_BFLOAT16
    if code < 0 or <Py_ssize_t>coll_dtype_size(<coll_dtype_t>code) != itemsize:
        return -1
    return code


cdef int format_dtype(const char *fmt, Py_ssize_t itemsize) noexcept:
    """The dtype code of a struct-module format (one type character after an
    optional byte-order mark), or -1 if unsupported."""
    if fmt == NULL:
        return COLL_UINT8
    while fmt[0] in b"@=<>!":
        if (fmt[0] == b"<") != COLL_LITTLE_ENDIAN and fmt[0] in b"<>!":
            return -1  # the other byte order: the kernels would misread it
        fmt += 1
    if fmt[0] == 0 or fmt[1] != 0:
        return -1
    return char_dtype(fmt[0], itemsize)


@cython.no_gc  # refers to its owner only, never to itself: no cycle to collect
cdef class _View:
    """A held buffer: released when the view is collected."""
    cdef Py_buffer buf
    cdef bint held
    cdef object owner
    cdef void *ptr
    cdef size_t nbytes
    cdef size_t count
    cdef int dtype
    cdef bint readonly
    cdef int device      # -1: host memory; else the CUDA device holding it
    cdef uintptr_t stream  # GPU: the producer's stream (0: legacy default)

    def __dealloc__(self):
        if self.held:
            PyBuffer_Release(&self.buf)
            self.held = False
        # Dropped here, where Cython has set aside any exception in flight: a DLPack
        # producer's deleter may run Python code (a ctypes callback), which must not run
        # with an exception set (that raised SystemError, or worse).
        self.owner = None


cdef object _is_gpu(obj):
    if hasattr(obj, "__cuda_array_interface__"):
        return True
    dev = getattr(obj, "__dlpack_device__", None)
    if dev is not None:
        try:
            return int(dev()[0]) != 1  # kDLCPU
        except Exception:
            return False
    return False


# (typestr kind, itemsize) -> dtype code, for __cuda_array_interface__.
_CAI_TYPES = {("i", 1): COLL_INT8, ("u", 1): COLL_UINT8, ("b", 1): COLL_UINT8,
              ("i", 4): COLL_INT32, ("i", 8): COLL_INT64, ("f", 2): COLL_FLOAT16,
              ("f", 4): COLL_FLOAT32, ("f", 8): COLL_FLOAT64, ("V", 2): COLL_BFLOAT16}
# (DLPack type code, bits) -> dtype code.
_DL_TYPES = {(0, 8): COLL_INT8, (1, 8): COLL_UINT8, (0, 32): COLL_INT32,
             (0, 64): COLL_INT64, (2, 16): COLL_FLOAT16, (4, 16): COLL_BFLOAT16,
             (2, 32): COLL_FLOAT32, (2, 64): COLL_FLOAT64}


cdef bint _c_contiguous(shape, strides, size_t itemsize):
    """True if strides (bytes, or None) describe a C-contiguous array of shape."""
    if strides is None:
        return True
    cdef size_t expect = itemsize
    for n, st in zip(reversed(list(shape)), reversed(list(strides))):
        if n != 1 and st != expect:
            return False
        expect *= n
    return True


cdef int _gpu_view(_View v, obj, str name, bint writable, object dtype) except -1:
    """Fill v from a GPU object: (dtype code or -1, count) set, ptr/device/stream set."""
    if not coll_cuda_built():
        raise TypeError(f"{name} is a GPU buffer, but this build of collectives has no CUDA "
                        f"support (nvcc was not found when it was built)")
    cdef int code = -1
    cdef size_t itemsize, count = 1
    cdef coll_DLManagedTensor *mt
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        ptr, ro = cai["data"]
        typestr = cai["typestr"]
        itemsize = int(typestr[2:])
        shape = tuple(cai["shape"])
        for n in shape:
            count *= n
        if writable and ro:
            raise ValueError(f"{name} is read-only")
        strides = cai.get("strides")
        if not _c_contiguous(shape, strides, itemsize):
            raise not_contiguous(name)
        if cai.get("mask") is not None:
            raise TypeError(f"{name} is a masked array")
        code = _CAI_TYPES.get((typestr[1], itemsize), -1)
        kind = typestr
        v.ptr = <void *><uintptr_t>(ptr or 0)
        stream = cai.get("stream") if int(cai.get("version", 0)) >= 3 else None
        # 1 and 2 are the legacy and per-thread default streams, which the
        # runtime also accepts as these very handle values.
        v.stream = <uintptr_t>(int(stream) if stream else 0)
        v.owner = obj
    else:
        # Legacy default stream (1): the producer orders its work before it,
        # and the collective waits on that stream.
        try:
            capsule = obj.__dlpack__(stream=1)
        except TypeError:
            capsule = obj.__dlpack__()
        if not PyCapsule_IsValid(capsule, b"dltensor"):
            raise TypeError(f"{name}: __dlpack__ did not return a DLPack tensor capsule")
        mt = <coll_DLManagedTensor *>PyCapsule_GetPointer(capsule, b"dltensor")
        if mt.dl_tensor.device.device_type not in (2, 13):  # kDLCUDA, kDLCUDAManaged
            raise TypeError(f"{name} is on DLPack device type {mt.dl_tensor.device.device_type}; "
                            f"only CUDA GPU buffers are supported")
        if mt.dl_tensor.dtype.lanes != 1:
            raise TypeError(f"{name} has vector elements (lanes {mt.dl_tensor.dtype.lanes})")
        itemsize = mt.dl_tensor.dtype.bits // 8
        shape = tuple(mt.dl_tensor.shape[i] for i in range(mt.dl_tensor.ndim))
        for n in shape:
            count *= n
        strides = None
        if mt.dl_tensor.strides != NULL:
            strides = tuple(mt.dl_tensor.strides[i] * itemsize for i in range(mt.dl_tensor.ndim))
        if not _c_contiguous(shape, strides, itemsize):
            raise not_contiguous(name)
        code = _DL_TYPES.get((mt.dl_tensor.dtype.code, mt.dl_tensor.dtype.bits), -1)
        kind = (mt.dl_tensor.dtype.code, mt.dl_tensor.dtype.bits)
        v.ptr = <void *>(<char *>mt.dl_tensor.data + mt.dl_tensor.byte_offset)
        v.stream = 0
        # The capsule stays ours (not renamed "used_dltensor"): when the view
        # drops it, its destructor calls the producer's deleter.
        v.owner = capsule
    v.readonly = False
    v.nbytes = count * itemsize
    v.device = coll_cuda_pointer_device(v.ptr) if v.nbytes else \
        (0 if coll_cuda_device_count() > 0 else -1)
    if v.device < 0 and cai is None:
        raise TypeError(f"{name}: the CUDA runtime does not know its memory as device memory")
    if v.device < 0:
        # __cuda_array_interface__ over memory the CUDA runtime does not know as device
        # memory (none at all without a driver): host memory, read in place as mpi4py hands
        # the pointer to MPI. Checked here, before any CUDA call: nothing can break.
        v.stream = 0
        v.readonly = bool(ro)
    if dtype is not None:
        if dtype not in DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}; expected one of {sorted(DTYPES)}")
        code = DTYPES[dtype]
    elif code < 0:
        raise unsupported_dtype(name, _gpu_dtype_name(obj, kind))
    v.dtype = code
    cdef size_t esize = coll_dtype_size(<coll_dtype_t>code)
    if v.nbytes % esize:
        raise ValueError(f"{name} has {v.nbytes} bytes, not a whole number of {dtype or 'elements'}")
    v.count = v.nbytes // esize
    return 0


# What a buffer argument may be, in the words of the error messages.
EXPECTED_BUFFER = ("a numpy array, a torch tensor, or any object with the buffer protocol, "
                   "__dlpack__ or __cuda_array_interface__ (CuPy, JAX)")


def not_a_buffer(str name, obj):
    """The TypeError for an argument that is no buffer at all (a list, a number, None)."""
    what = type(obj).__name__
    hint = ""
    if isinstance(obj, (list, tuple, int, float, complex)):
        hint = f"; convert a Python {what} with numpy.asarray(...)"
    return TypeError(f"{name} must be {EXPECTED_BUFFER}, not {what}{hint}")


def not_contiguous(str name):
    """The ValueError for a strided view (a transpose, a slice with a step)."""
    return ValueError(f"{name} is not contiguous in memory (a transposed or strided view): "
                      f"pass tensor.contiguous() for a torch tensor, "
                      f"numpy.ascontiguousarray(a) for a numpy array")


ERR_TYPE = 12  # MPI's error class for a bad datatype (collectives.MPI.ERR_TYPE is this)


class DatatypeError(CollectivesError, TypeError):
    """A buffer whose element type the core does not carry: an ``MPI.Exception`` with
    error class ERR_TYPE (as mpi4py raises for a datatype) and a ``TypeError``."""


def unsupported_dtype(str name, str dtype_name):
    """The DatatypeError for an element type the core has no kernel for."""
    return DatatypeError(COLL_INVALID_ARGUMENT,
                         f"{name} has element type {dtype_name}, which collectives does not "
                         f"support; supported: {', '.join(DTYPES)}", ERR_TYPE)


cdef str _format_dtype_name(target, const char *fmt, Py_ssize_t itemsize):
    """A numpy-style name ("int16", "complex64") for a buffer's element type;
    the format code itself only when numpy cannot name it either."""
    name = getattr(getattr(target, "dtype", None), "name", None)
    if isinstance(name, str):
        return name
    text = fmt.decode("ascii", "replace") if fmt != NULL else "B"
    try:
        import numpy
        return numpy.asarray(memoryview(target)).dtype.name
    except Exception:
        return f"format {text!r} ({itemsize} bytes)"


# DLPack type codes, for naming an unsupported element type.
_DL_KINDS = {0: "int", 1: "uint", 2: "float", 4: "bfloat", 5: "complex", 6: "bool"}


cdef str _gpu_dtype_name(obj, kind):
    """A GPU object's element type in its framework's words ("torch.int16" -> int16), else
    numpy's name of its __cuda_array_interface__ typestr or of its DLPack (code, bits)."""
    dt = getattr(obj, "dtype", None)
    if dt is not None:
        return str(dt).replace("torch.", "")
    if isinstance(kind, str):
        try:
            import numpy
            return numpy.dtype(kind).name
        except Exception:
            return f"typestr {kind!r}"
    code, bits = kind
    if code == 6:
        return "bool"
    return f"{_DL_KINDS.get(code, f'DLPack type code {code} of ')}{bits}"


cdef int _ndarray_dtype(cnp.ndarray arr) noexcept:
    """The dtype code of a native-order numpy array's elements, or -1 (the
    buffer protocol then decides, and words any error)."""
    cdef cnp.dtype d = <cnp.dtype>cnp.PyArray_DESCR(arr)  # borrowed: arr holds it
    if d.byteorder != b"|" and not cnp.PyArray_IsNativeByteOrder(d.byteorder):
        return -1
    # ml_dtypes' types are kind 'V': only bfloat16 ('E'); its others reuse
    # letters ('e' is int1). Other kinds: numbers only, not 'S1' bytes or bool.
    if d.kind == b"V" and d.type != b"E" or d.kind not in b"iufV":
        return -1
    return char_dtype(d.type, cnp.PyDataType_ELSIZE(d))


cdef object _dlpack_host(_View v, obj, str name, bint writable, object dtype):
    """Fill v from a CPU __dlpack__ object, reading its capsule in place: DLPack 1.0's
    "dltensor_versioned" (asked for first) or the legacy "dltensor". Returns None, or the
    exception to raise: the capsule is dropped first, so that the producer's deleter never
    runs while an exception is in flight."""
    cdef coll_DLTensor *t = NULL
    cdef coll_DLManagedTensorVersioned *mv
    cdef size_t itemsize, count = 1
    cdef bint ro = False
    try:
        capsule = obj.__dlpack__(max_version=(1, 0))
    except TypeError:  # a producer older than DLPack 1.0: no keyword
        capsule = obj.__dlpack__()
    if PyCapsule_IsValid(capsule, b"dltensor_versioned"):
        mv = <coll_DLManagedTensorVersioned *>PyCapsule_GetPointer(capsule, b"dltensor_versioned")
        if mv.version.major != 1:
            capsule = None
            return TypeError(f"{name}: DLPack version {mv.version.major} is not supported")
        t = &mv.dl_tensor
        ro = (mv.flags & COLL_DLPACK_FLAG_READ_ONLY) != 0
    elif PyCapsule_IsValid(capsule, b"dltensor"):
        t = &(<coll_DLManagedTensor *>PyCapsule_GetPointer(capsule, b"dltensor")).dl_tensor
    else:
        capsule = None
        return TypeError(f"{name}: __dlpack__ did not return a DLPack tensor capsule")
    err = None
    if t.device.device_type not in (1, 3):  # kDLCPU, kDLCUDAHost (pinned host memory)
        err = TypeError(f"{name} is on DLPack device type {t.device.device_type}, not host memory")
    elif t.dtype.lanes != 1:
        err = TypeError(f"{name} has vector elements (lanes {t.dtype.lanes})")
    elif writable and ro:
        err = ValueError(f"{name} is read-only")
    if err is None:
        itemsize = t.dtype.bits // 8
        shape = tuple(t.shape[i] for i in range(t.ndim))
        for n in shape:
            count *= n
        strides = None
        if t.strides != NULL:
            strides = tuple(t.strides[i] * itemsize for i in range(t.ndim))
        if not _c_contiguous(shape, strides, itemsize):
            err = not_contiguous(name)
    if err is None:
        code = _DL_TYPES.get((t.dtype.code, t.dtype.bits), -1)
        if dtype is not None:
            code = DTYPES.get(dtype, -1)
            if code < 0:
                err = ValueError(f"unknown dtype {dtype!r}; expected one of {sorted(DTYPES)}")
        elif code < 0:
            err = unsupported_dtype(name, _gpu_dtype_name(obj, (t.dtype.code, t.dtype.bits)))
    if err is None and (count * itemsize) % coll_dtype_size(<coll_dtype_t>code):
        err = ValueError(f"{name} has {count * itemsize} bytes, not a whole number of {dtype}")
    if err is not None:
        capsule = None
        return err
    v.ptr = <void *>(<char *>t.data + t.byte_offset)
    v.nbytes = count * itemsize
    v.dtype = code
    v.count = v.nbytes // coll_dtype_size(<coll_dtype_t>code)
    v.readonly = ro
    v.device = -1
    v.owner = capsule  # kept, not renamed "used_": its destructor calls the deleter
    return None


cdef char _zero_bytes[8]  # where an empty buffer without memory points (never read)


cdef _View as_view(obj, str name, bint writable, object dtype):
    """Resolve obj into a contiguous view; `name` is used in messages. An empty buffer
    always has a non-NULL pointer: the core reads NULL as "no buffer" (a rooted block with
    a NULL destination is a send), and an empty array.array or DLPack tensor may have none."""
    cdef _View v = _as_view(obj, name, writable, dtype)
    if v.ptr == NULL:
        if v.nbytes:
            v = None
            raise ValueError(f"{name}: NULL data pointer for a non-empty buffer")
        v.ptr = <void *>_zero_bytes
    return v


cdef _View _as_view(obj, str name, bint writable, object dtype):
    if obj is None:
        raise not_a_buffer(name, obj)
    cdef _View v = _View()
    v.device = -1
    cdef cnp.ndarray arr
    cdef int code
    # The common case, a contiguous numpy array of a supported type, is read
    # through numpy's C API: a tenth of the cost of a buffer export. The view
    # holds the array itself. Anything else takes the buffer protocol below.
    if dtype is None and cnp.PyArray_Check(obj):
        arr = <cnp.ndarray>obj
        code = _ndarray_dtype(arr)
        if code >= 0 and cnp.PyArray_IS_C_CONTIGUOUS(arr) and \
                (cnp.PyArray_ISWRITEABLE(arr) or not writable):
            v.owner = obj
            v.ptr = cnp.PyArray_DATA(arr)
            v.nbytes = <size_t>cnp.PyArray_NBYTES(arr)
            v.readonly = not cnp.PyArray_ISWRITEABLE(arr)
            v.dtype = code
            v.count = <size_t>cnp.PyArray_SIZE(arr)
            return v
    # Buffer-protocol exporters are host memory (no GPU array exports it):
    # the common case skips the GPU probes.
    if not PyObject_CheckBuffer(obj) and _is_gpu(obj):
        _gpu_view(v, obj, name, writable, dtype)
        return v
    cdef int flags = PyBUF_FORMAT | PyBUF_C_CONTIGUOUS
    if writable:
        flags |= PyBUF_WRITABLE
    target = obj
    for attempt in range(2):
        try:
            PyObject_GetBuffer(target, &v.buf, flags)
            break
        except (BufferError, ValueError) as exc:  # numpy says ValueError
            text = str(exc)
            if writable and ("writ" in text or "read-only" in text or "readonly" in text):
                raise ValueError(f"{name} is read-only") from None
            if "contiguous" in text:
                raise not_contiguous(name) from None
            raise TypeError(f"{name}: {text}") from None
        except TypeError:
            if attempt == 0 and _is_gpu(obj):
                # A GPU array that also claims the buffer protocol only to
                # refuse it (CuPy's ndarray): its device view.
                _gpu_view(v, obj, name, writable, dtype)
                return v
            if attempt == 0 and hasattr(obj, "__dlpack__"):
                err = _dlpack_host(v, obj, name, writable, dtype)
                if err is not None:
                    v = None  # drop what the view holds before raising (see _dlpack_host)
                    raise err
                return v
            raise not_a_buffer(name, obj) from None
    v.held = True
    v.owner = target
    v.ptr = v.buf.buf
    v.nbytes = <size_t>v.buf.len
    v.readonly = v.buf.readonly
    if dtype is not None:
        if dtype not in DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}; expected one of {sorted(DTYPES)}")
        code = DTYPES[dtype]
    else:
        code = format_dtype(v.buf.format, v.buf.itemsize)
        if code < 0:
            raise unsupported_dtype(name, _format_dtype_name(target, v.buf.format, v.buf.itemsize))
    v.dtype = code
    cdef size_t esize = coll_dtype_size(<coll_dtype_t>code)
    if v.nbytes % esize:
        raise ValueError(f"{name} has {v.nbytes} bytes, not a whole number of {dtype or 'elements'}")
    v.count = v.nbytes // esize
    return v


cdef int set_memory(coll_args_t *a, object stream, _View first, _View second=None) except -1:
    """Where the buffers live (all host, or all on one GPU) and the stream to follow."""
    if second is not None and second.device != first.device:
        where = lambda v: "host memory" if v.device < 0 else f"CUDA device {v.device}"
        raise TypeError(f"sendbuf is in {where(second)} but recvbuf is in {where(first)}; "
                        f"both must be on the same device")
    if first.device < 0:
        if stream is not None:
            raise ValueError("stream= applies to GPU buffers only")
        return 0
    a.memory = COLL_MEMORY_CUDA
    a.device = first.device
    if stream is None:
        a.stream = <void *>first.stream
    else:
        # A CuPy/torch stream object, or a raw cudaStream_t as an integer.
        handle = getattr(stream, "cuda_stream", None)
        if handle is None:
            handle = getattr(stream, "ptr", stream)
        a.stream = <void *><uintptr_t>int(handle)
    return 0


cdef int code_of(dict table, object key, str what) except -1:
    code = table.get(key)  # the common case: already the lower-case name
    if code is not None:
        return code
    try:
        return table[key.lower() if isinstance(key, str) else key]
    except (KeyError, AttributeError):
        raise ValueError(f"unknown {what} {key!r}; expected one of {', '.join(table)}") from None


cdef double as_timeout(object timeout) except? -1:
    if timeout is None:
        return 0.0
    t = float(timeout)
    if not t > 0:
        raise ValueError(f"timeout must be positive seconds, got {timeout!r}")
    return t


cdef int check_overlap(_View a, _View b, str what) except -1:
    """Distinct send and receive buffers must not overlap (in place is a == b)."""
    cdef char *pa = <char *>a.ptr
    cdef char *pb = <char *>b.ptr
    if pa == pb or a.nbytes == 0 or b.nbytes == 0:
        return 0
    if pa < pb + b.nbytes and pb < pa + a.nbytes:
        raise ValueError(f"{what}: sendbuf and recvbuf overlap; use IN_PLACE instead")
    return 0


# dtype code -> numpy type number, for host_array (bfloat16: numpy has none; its bits).
_NP_TYPES = {COLL_INT8: cnp.NPY_INT8, COLL_UINT8: cnp.NPY_UINT8, COLL_INT32: cnp.NPY_INT32,
             COLL_INT64: cnp.NPY_INT64, COLL_FLOAT16: cnp.NPY_FLOAT16,
             COLL_BFLOAT16: cnp.NPY_UINT16, COLL_FLOAT32: cnp.NPY_FLOAT32,
             COLL_FLOAT64: cnp.NPY_FLOAT64}


def host_array(obj, str name="buffer", bint writable=False, dtype=None):
    """A 1-D numpy array over obj's own memory (no copy) for any host buffer as_view takes
    (buffer protocol, __dlpack__, __cuda_array_interface__ over host memory), so that Python
    code writes into the caller's memory, never into a copy. It keeps obj's view alive;
    read-only when obj is. bfloat16 comes as uint16 (its bits). TypeError for GPU memory."""
    cdef _View v = as_view(obj, name, writable, dtype)
    if v.device >= 0:
        raise TypeError(f"{name} is a GPU buffer; this call takes host memory")
    cdef cnp.npy_intp n = <cnp.npy_intp>v.count
    cdef cnp.ndarray arr = cnp.PyArray_SimpleNewFromData(1, &n, _NP_TYPES[v.dtype],
                                                         v.ptr if v.ptr != NULL else <void *>&n)
    cnp.set_array_base(arr, v)
    if v.readonly:
        arr.flags.writeable = False
    return arr
