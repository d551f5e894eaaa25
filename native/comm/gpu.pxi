# GPU helpers of the _core module: whether CUDA was built and is usable, plain
# device memory with __cuda_array_interface__ (DeviceBuffer), the device copy
# bandwidth the bench compares with, and the CUDA IPC mappings open now.

def cuda_built() -> bool:
    """True if the CUDA parts were compiled into this module."""
    return bool(coll_cuda_built())


def cuda_ipc_mappings() -> int:
    """Peer allocations this process has mapped through CUDA IPC now (0 without a GPU)."""
    return coll_cuda_ipc_open_count()


def cuda_stats(comm) -> dict:
    """What the device paths did on `comm` (a Communicator) since its first GPU call.

    small_calls: calls staged whole through pinned memory (COLLECTIVES_CUDA_SMALL_BYTES);
    whole_calls: reduce, gatherv, scatterv and alltoallv calls staged whole (any size);
    device_runs: schedules run by the device executor; staged_pieces: pieces sent on
    pinned-staged links; staged_max_ahead / staged_max_apply: most pieces of one link
    staged ahead of its socket / handed to the GPU and not yet seen done at once;
    ipc_descs: CUDA IPC descriptors posted; ipc_max_posted: most of one link posted and
    not yet acknowledged; ipc_signals: IPC records ordered by an interprocess event
    (COLLECTIVES_CUDA_IPC_EVENTS=1); ipc_slot_reuses: those whose event had been
    recorded before; gpu_waits: times the device executor slept on the GPU inside a
    call. All 0 before the first GPU call.
    """
    cdef Communicator c = comm
    cdef coll_cuda_stats_t *s = coll_cuda_stats(c._live())
    names = ("small_calls", "whole_calls", "device_runs", "staged_pieces", "staged_max_ahead",
             "staged_max_apply", "ipc_descs", "ipc_max_posted", "ipc_signals", "ipc_slot_reuses",
             "gpu_waits")
    if s == NULL:
        return dict.fromkeys(names, 0)
    return dict(zip(names, (s.small_calls, s.whole_calls, s.device_runs, s.staged_pieces, s.staged_max_ahead,
                            s.staged_max_apply, s.ipc_descs, s.ipc_max_posted, s.ipc_signals,
                            s.ipc_slot_reuses, s.gpu_waits)))


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
