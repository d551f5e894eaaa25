# libcoll.pxd -- declarations of the C API in coll.h (and the pure rank arithmetic of
# pattern.h, exposed for tests). Nothing but extern declarations here.
from libc.stdint cimport int64_t, uint8_t, uint64_t

cdef extern from "coll.h" nogil:
    ctypedef enum coll_result_t:
        COLL_SUCCESS
        COLL_INVALID_ARGUMENT
        COLL_INVALID_USAGE
        COLL_SYSTEM_ERROR
        COLL_REMOTE_ERROR
        COLL_TIMEOUT
        COLL_INTERNAL_ERROR
        COLL_CUDA_ERROR

    ctypedef enum coll_dtype_t:
        COLL_INT8
        COLL_UINT8
        COLL_INT32
        COLL_INT64
        COLL_FLOAT16
        COLL_BFLOAT16
        COLL_FLOAT32
        COLL_FLOAT64
        COLL_NUM_DTYPES

    ctypedef enum coll_op_t:
        COLL_SUM
        COLL_PROD
        COLL_MIN
        COLL_MAX
        COLL_AVG
        COLL_NUM_OPS

    ctypedef enum coll_algo_t:
        COLL_ALGO_AUTO
        COLL_ALGO_RING
        COLL_ALGO_TREE
        COLL_ALGO_BUTTERFLY
        COLL_ALGO_TWO_LEVEL
        COLL_NUM_ALGOS

    ctypedef enum coll_memory_t:
        COLL_MEMORY_HOST
        COLL_MEMORY_CUDA

    ctypedef struct coll_comm_t:
        pass
    ctypedef struct coll_request_t:
        pass

    ctypedef struct coll_args_t:
        const void *sendbuf
        void *recvbuf
        size_t count
        const size_t *counts
        const size_t *displs
        coll_dtype_t dtype
        coll_op_t op
        int root
        coll_algo_t algo
        double timeout
        size_t segment_bytes
        coll_memory_t memory
        int device
        void *stream
        void *ready_event
        int peer
        int tag

    ctypedef struct coll_status_t:
        int source
        int tag
        size_t count
        size_t nbytes
        coll_dtype_t dtype

    enum:
        COLL_ANY_SOURCE
        COLL_ANY_TAG
        COLL_PROC_NULL
        COLL_ROOT_REFUSED
        COLL_TAG_MAX
    const size_t COLL_COUNT_ANY

    int coll_cuda_built()
    int coll_cuda_device_count()
    int coll_cuda_ipc_open_count()

    coll_result_t coll_comm_create(int rank, int size, const char *bind_host,
                                   const uint8_t *comm_id, coll_comm_t **out)
    int coll_comm_port(const coll_comm_t *comm)
    coll_result_t coll_comm_set_link_key(coll_comm_t *comm, const uint8_t *key, size_t n)
    void coll_hmac_sha256(const uint8_t *key, size_t keylen, const uint8_t *msg, size_t n,
                          uint8_t *out)
    int coll_shm_path_ok(const char *path, int frm, int to, uint64_t token)
    coll_result_t coll_comm_set_peer(coll_comm_t *comm, int peer, const char *host, int port)
    void coll_comm_set_spin(coll_comm_t *comm, double us)
    void coll_comm_set_oversubscribed(coll_comm_t *comm, int oversubscribed)
    void coll_comm_set_job_oversubscribed(coll_comm_t *comm, int oversubscribed)
    void coll_comm_bind_cpu(coll_comm_t *comm, int cpu)
    coll_result_t coll_comm_set_peer_host(coll_comm_t *comm, int peer, const char *host_id)
    const char *coll_comm_peer_host(const coll_comm_t *comm, int peer)
    void coll_comm_destroy(coll_comm_t *comm)
    int COLL_UNDEFINED
    coll_result_t coll_comm_split(coll_comm_t *comm, int color, int key, double timeout,
                                  coll_comm_t **out) nogil
    coll_result_t coll_comm_dup(coll_comm_t *comm, double timeout, coll_comm_t **out) nogil
    coll_result_t coll_comm_create_group(coll_comm_t *comm, const int *ranks, int n,
                                         unsigned int tag, coll_comm_t **out) nogil
    coll_result_t coll_comm_free(coll_comm_t *comm) nogil
    int coll_comm_world_rank(const coll_comm_t *comm, int rank)
    int coll_comm_local_rank(const coll_comm_t *comm, int world_rank)
    unsigned int coll_comm_ctx(const coll_comm_t *comm)
    coll_result_t coll_comm_set_generation(coll_comm_t *comm, unsigned int gen)
    unsigned int coll_comm_generation(const coll_comm_t *comm)
    int coll_comm_rank(const coll_comm_t *comm)
    int coll_comm_size(const coll_comm_t *comm)
    const char *coll_comm_last_error(const coll_comm_t *comm)
    int coll_comm_is_broken(const coll_comm_t *comm)
    int64_t coll_comm_id(coll_comm_t *comm)
    coll_comm_t *coll_comm_from_id(int64_t id)
    int coll_comm_num_links(const coll_comm_t *comm)
    size_t coll_comm_segment_bytes(coll_comm_t *comm)

    coll_result_t coll_allreduce(coll_comm_t *comm, const coll_args_t *args)
    coll_result_t coll_allgatherv(coll_comm_t *comm, const coll_args_t *args)
    coll_result_t coll_broadcast(coll_comm_t *comm, const coll_args_t *args)
    coll_result_t coll_reduce_scatter_block(coll_comm_t *comm, const coll_args_t *args)
    coll_result_t coll_barrier(coll_comm_t *comm, double timeout)
    coll_result_t coll_reduce(coll_comm_t *comm, const coll_args_t *args)
    coll_result_t coll_gatherv(coll_comm_t *comm, const coll_args_t *args)
    coll_result_t coll_scatterv(coll_comm_t *comm, const coll_args_t *args)
    coll_result_t coll_ialltoallv(coll_comm_t *comm, const coll_args_t *args, coll_request_t **req)
    coll_result_t coll_alltoallv(coll_comm_t *comm, const coll_args_t *args)

    coll_result_t coll_iallreduce(coll_comm_t *comm, const coll_args_t *args, coll_request_t **req)
    coll_result_t coll_iallgatherv(coll_comm_t *comm, const coll_args_t *args, coll_request_t **req)
    coll_result_t coll_ibroadcast(coll_comm_t *comm, const coll_args_t *args, coll_request_t **req)
    coll_result_t coll_ireduce(coll_comm_t *comm, const coll_args_t *args, coll_request_t **req)
    coll_result_t coll_igatherv(coll_comm_t *comm, const coll_args_t *args, coll_request_t **req)
    coll_result_t coll_iscatterv(coll_comm_t *comm, const coll_args_t *args, coll_request_t **req)
    coll_result_t coll_ireduce_scatter_block(coll_comm_t *comm, const coll_args_t *args,
                                             coll_request_t **req)
    coll_result_t coll_ibarrier(coll_comm_t *comm, double timeout, coll_request_t **req)
    coll_result_t coll_request_wait(coll_request_t *req)
    coll_result_t coll_request_test(coll_request_t *req, int *done)
    void coll_request_free(coll_request_t *req)

    coll_result_t coll_isend(coll_comm_t *comm, const coll_args_t *args, coll_request_t **req)
    coll_result_t coll_irecv(coll_comm_t *comm, const coll_args_t *args, coll_request_t **req)
    coll_result_t coll_send(coll_comm_t *comm, const coll_args_t *args)
    coll_result_t coll_ssend(coll_comm_t *comm, const coll_args_t *args)
    coll_result_t coll_issend(coll_comm_t *comm, const coll_args_t *args, coll_request_t **req)
    coll_result_t coll_probe(coll_comm_t *comm, int source, int tag, double timeout, int block,
                             int *flag, coll_status_t *status)
    coll_result_t coll_recv(coll_comm_t *comm, const coll_args_t *args, coll_status_t *status)
    coll_result_t coll_sendrecv(coll_comm_t *comm, const coll_args_t *send_args,
                                const coll_args_t *recv_args, coll_status_t *status)
    coll_result_t coll_request_status(const coll_request_t *req, coll_status_t *status)
    coll_result_t coll_request_take_buffer(coll_request_t *req, void **buf, size_t *nbytes)
    coll_result_t coll_request_wait_any(coll_request_t **reqs, int n, int *index)

    coll_result_t coll_reduce_local(void *out, const void *in1, const void *in2, size_t count,
                                    coll_dtype_t dtype, coll_op_t op)
    coll_result_t coll_scale_local(void *out, const void *inp, size_t count, coll_dtype_t dtype,
                                   double divisor)
    size_t coll_dtype_size(coll_dtype_t dtype)
    const char *coll_dtype_name(coll_dtype_t dtype)
    const char *coll_op_name(coll_op_t op)
    const char *coll_algo_name(coll_algo_t algo)
    const char *coll_strerror(coll_result_t res)
    coll_algo_t coll_tune_choose(int size, size_t nbytes)

    int coll_param_count()
    const char *coll_param_name(int i)
    const char *coll_param_default(int i)
    const char *coll_param_description(int i)
    const char *coll_param_allowed(int i)

cdef extern from "algorithms/pattern.h" nogil:
    void coll_split(size_t count, int parts, int i, size_t *off, size_t *len)
    int coll_ring_rs_send_chunk(int r, int n, int s)
    int coll_ring_rs_recv_chunk(int r, int n, int s)
    int coll_ring_ag_send_chunk(int r, int n, int s)
    int coll_ring_ag_recv_chunk(int r, int n, int s)
    int coll_tree_parent(int r, int n, int root)
    int coll_tree_child(int r, int n, int root, int which)
    int coll_binomial_parent(int r, int n, int root)
    int coll_binomial_children(int r, int n, int root, int *out)
    int coll_pow2_floor(int n)
    int coll_bfly_vrank(int r, int n)
    int coll_bfly_real(int v, int n)

cdef extern from "algorithms/topology.h" nogil:
    ctypedef struct coll_topo_t:
        int n
        int nhosts
        int *host
        int *local
        int *order
        int *first
        int *pos
        int min_local
        int max_local
    int coll_topo_build(coll_topo_t *t, int n, const int *labels)
    void coll_topo_free(coll_topo_t *t)
    int coll_topo_owner(const coll_topo_t *t, int h, int j)
    int coll_topo_two_level(const coll_topo_t *t)

cdef extern from "transport/wire.h" nogil:
    enum:
        COLL_KIND_ALLREDUCE
        COLL_KIND_ALLGATHERV
        COLL_KIND_REDUCE_SCATTER

cdef extern from "algorithms/algorithms.h" nogil:
    coll_algo_t coll_tune_choose_topo(const coll_topo_t *t, int size, size_t nbytes, int all_shm)
    coll_result_t coll_dryrun(int n, const int *labels, int rank, int kind, coll_algo_t algo,
                              size_t count, coll_dtype_t dtype, size_t segment_bytes,
                              const void *inp, void *out, long long **steps, int *nsteps,
                              int **edges, int *nedges)

cdef extern from "transport/crypt.h" nogil:
    const char *coll_crypt_lib_error()
    int coll_crypt_hkdf(const uint8_t *ikm, size_t nikm, const uint8_t *salt, size_t nsalt,
                        const uint8_t *info, size_t ninfo, uint8_t *out, size_t nout)
    int coll_crypt_seal(const uint8_t *key, const uint8_t *iv, const uint8_t *aad, size_t naad,
                        const uint8_t *pt, size_t n, uint8_t *out)

cdef extern from "reduce/sparse.h" nogil:
    coll_result_t coll_sparse_count_above(const float *x, size_t n, float threshold,
                                          size_t *count)
    coll_result_t coll_sparse_pack(const float *x, size_t n, float threshold, size_t cap,
                                   void *values, coll_dtype_t value_dtype, void *indices,
                                   coll_dtype_t index_dtype, size_t *count)
    coll_result_t coll_sparse_scatter_add(float *out, size_t n, const void *values,
                                          coll_dtype_t value_dtype, const void *indices,
                                          coll_dtype_t index_dtype, size_t count)


cdef extern from "cuda/cuda.h" nogil:
    ctypedef struct coll_cuda_stats_t:
        uint64_t small_calls
        uint64_t whole_calls
        uint64_t device_runs
        uint64_t staged_pieces
        uint64_t staged_max_ahead
        uint64_t staged_max_apply
        uint64_t ipc_descs
        uint64_t ipc_max_posted
        uint64_t ipc_signals
        uint64_t ipc_slot_reuses
        uint64_t gpu_waits
    coll_cuda_stats_t *coll_cuda_stats(coll_comm_t *comm)
    int coll_cuda_pointer_device(const void *p)
    const char *coll_cuda_error_text()
    coll_result_t coll_cuda_alloc(int device, size_t n, void **p)
    void coll_cuda_free(void *p)
    coll_result_t coll_cuda_memcpy(void *dst, const void *src, size_t n)
    coll_result_t coll_cuda_copy_bandwidth(int device, size_t n, int iters, double *gbps)
