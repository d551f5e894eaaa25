# buffer.pxi -- one path from any buffer-like object to one C view
# (pointer, bytes, dtype, element count, read-only flag). Nothing downstream
# knows where a buffer came from.
#
# Accepted: PEP 3118 exporters (numpy, bytearray, memoryview, array.array),
# and CPU objects with __dlpack__ (PyTorch, JAX) through numpy.from_dlpack,
# which shares their memory. GPU buffers (__cuda_array_interface__ or a CUDA
# DLPack device) raise TypeError until the GPU path exists.

from cpython.buffer cimport (PyBUF_C_CONTIGUOUS, PyBUF_FORMAT, PyBUF_WRITABLE,
                             PyBuffer_Release, PyObject_GetBuffer)

DTYPES = {
    "int8": COLL_INT8, "uint8": COLL_UINT8, "int32": COLL_INT32, "int64": COLL_INT64,
    "float16": COLL_FLOAT16, "bfloat16": COLL_BFLOAT16, "float32": COLL_FLOAT32,
    "float64": COLL_FLOAT64,
}
OPS = {"sum": COLL_SUM, "prod": COLL_PROD, "min": COLL_MIN, "max": COLL_MAX, "avg": COLL_AVG}
ALGORITHMS = {"auto": COLL_ALGO_AUTO, "ring": COLL_ALGO_RING, "tree": COLL_ALGO_TREE,
              "butterfly": COLL_ALGO_BUTTERFLY}


cdef int format_dtype(bytes fmt, Py_ssize_t itemsize) except -2:
    """The dtype code of a struct-module format, or -1 if unsupported."""
    f = fmt.lstrip(b"@=<>!")
    if f in (b"b",):
        return COLL_INT8
    if f in (b"B", b"c"):
        return COLL_UINT8
    if f in (b"i", b"l", b"q", b"n"):
        return COLL_INT32 if itemsize == 4 else (COLL_INT64 if itemsize == 8 else -1)
    if f == b"e":
        return COLL_FLOAT16
    if f == b"f":
        return COLL_FLOAT32
    if f == b"d":
        return COLL_FLOAT64
    if f == b"E":  # ml_dtypes' bfloat16 exports this
        return COLL_BFLOAT16
    return -1


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

    def __dealloc__(self):
        if self.held:
            PyBuffer_Release(&self.buf)
            self.held = False


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


cdef _View as_view(obj, str name, bint writable, object dtype):
    """Resolve obj into a contiguous view; `name` is used in messages."""
    if obj is None:
        raise TypeError(f"{name} is None")
    if _is_gpu(obj):
        raise TypeError(f"{name} is a GPU buffer; this build supports host memory only")
    cdef _View v = _View()
    cdef int flags = PyBUF_FORMAT | PyBUF_C_CONTIGUOUS
    if writable:
        flags |= PyBUF_WRITABLE
    target = obj
    for attempt in range(2):
        try:
            PyObject_GetBuffer(target, &v.buf, flags)
            break
        except BufferError as exc:
            text = str(exc)
            if writable and ("writ" in text or "read-only" in text or "readonly" in text):
                raise ValueError(f"{name} is read-only") from None
            if "contiguous" in text:
                raise ValueError(f"{name} is not C-contiguous") from None
            raise TypeError(f"{name}: {text}") from None
        except TypeError:
            if attempt == 0 and hasattr(obj, "__dlpack__"):
                import numpy
                try:
                    target = numpy.from_dlpack(obj)
                except Exception as exc:
                    raise TypeError(f"{name}: cannot view {type(obj).__name__} as host memory: "
                                    f"{exc}") from None
                continue
            raise TypeError(f"{name} ({type(obj).__name__}) does not expose a buffer") from None
    v.held = True
    v.owner = target
    v.ptr = v.buf.buf
    v.nbytes = <size_t>v.buf.len
    v.readonly = v.buf.readonly
    fmt = v.buf.format if v.buf.format != NULL else b"B"
    cdef int code
    if dtype is not None:
        if dtype not in DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}; expected one of {sorted(DTYPES)}")
        code = DTYPES[dtype]
    else:
        code = format_dtype(fmt, v.buf.itemsize)
        if code < 0:
            raise TypeError(f"{name} has unsupported element type {fmt.decode()!r} "
                            f"(itemsize {v.buf.itemsize}); supported: {', '.join(DTYPES)}")
    v.dtype = code
    cdef size_t esize = coll_dtype_size(<coll_dtype_t>code)
    if v.nbytes % esize:
        raise ValueError(f"{name} has {v.nbytes} bytes, not a whole number of {dtype or 'elements'}")
    v.count = v.nbytes // esize
    return v


cdef int code_of(dict table, object key, str what) except -1:
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
