# GPU helpers of the _core module: whether CUDA was built and is usable, plain
# device memory with __cuda_array_interface__ (DeviceBuffer), the device copy
# bandwidth the bench compares with, and the CUDA IPC mappings open now.

def cuda_built() -> bool:
    """True if the CUDA parts were compiled into this module."""
    return bool(coll_cuda_built())


def cuda_ipc_mappings() -> int:
    """Peer allocations this process has mapped through CUDA IPC now (0 without a GPU)."""
    return coll_cuda_ipc_open_count()


def cuda_device_count() -> int:
    """Usable GPUs (0 without a driver or device, or in a build without CUDA)."""
    return coll_cuda_device_count()


cdef class DeviceBuffer:
    """Plain device memory with __cuda_array_interface__, for tests and the bench.

    Lets collectives-bench and the GPU tests run without CuPy or a CUDA build
    of PyTorch. Args: nbytes, dtype name (a DTYPES key), device ordinal.
    """
    cdef void *ptr
    cdef size_t _nbytes
    cdef str _dtype
    cdef int _device

    @property
    def nbytes(self) -> int:
        """Size in bytes."""
        return self._nbytes

    @property
    def dtype(self) -> str:
        """Element type name (a DTYPES key)."""
        return self._dtype

    @property
    def device(self) -> int:
        """The CUDA device ordinal holding the memory."""
        return self._device

    def __cinit__(self, size_t nbytes, str dtype="uint8", int device=0):
        if dtype not in DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}")
        self._dtype = dtype
        self._device = device
        self._nbytes = nbytes
        cdef coll_result_t res
        with nogil:
            res = coll_cuda_alloc(device, nbytes, &self.ptr)
        if res != COLL_SUCCESS:
            raise CollectivesError(<int>res, coll_cuda_error_text().decode())

    def __dealloc__(self):
        if self.ptr != NULL:
            coll_cuda_free(self.ptr)
            self.ptr = NULL

    @property
    def __cuda_array_interface__(self) -> dict:
        size = coll_dtype_size(<coll_dtype_t>DTYPES[self._dtype])
        kinds = {"int8": "|i1", "uint8": "|u1", "int32": "<i4", "int64": "<i8",
                 "float16": "<f2", "bfloat16": "<V2", "float32": "<f4", "float64": "<f8"}
        return {"shape": (self._nbytes // size,), "typestr": kinds[self._dtype],
                "data": (<uintptr_t>self.ptr, False), "version": 3, "strides": None,
                "stream": None}

    def copy_from(self, src) -> None:
        """Copy a host buffer of exactly nbytes into this memory (synchronous)."""
        cdef _View v = host_view(src, "src", False, "uint8")
        if v.nbytes != self._nbytes:
            raise ValueError(f"src has {v.nbytes} bytes, this buffer {self._nbytes}")
        self._copy(self.ptr, v.ptr, v.nbytes)

    def copy_to(self, dst) -> None:
        """Copy this memory into a writable host buffer of exactly nbytes (synchronous)."""
        cdef _View v = host_view(dst, "dst", True, "uint8")
        if v.nbytes != self._nbytes:
            raise ValueError(f"dst has {v.nbytes} bytes, this buffer {self._nbytes}")
        self._copy(v.ptr, self.ptr, v.nbytes)

    cdef _copy(self, void *dst, const void *src, size_t n):
        cdef coll_result_t res
        with nogil:
            res = coll_cuda_memcpy(dst, src, n)
        if res != COLL_SUCCESS:
            raise CollectivesError(<int>res, coll_cuda_error_text().decode())


def cuda_copy_bandwidth(int device=0, size_t nbytes=256 << 20, int iters=10) -> float:
    """Device-to-device cudaMemcpy bandwidth in GB/s (bytes copied / time)."""
    cdef double gbps = 0
    cdef coll_result_t res
    with nogil:
        res = coll_cuda_copy_bandwidth(device, nbytes, iters, &gbps)
    if res != COLL_SUCCESS:
        raise CollectivesError(<int>res, coll_cuda_error_text().decode() or "CUDA copy failed")
    return gbps
