# Topology arithmetic (algorithms/topology.h) and schedule dry runs
# (algorithms/dryrun.c), exposed for tests: no communicator, no socket.

def topology(labels) -> dict:
    """The host picture every rank derives from the ranks' host labels.

    Args:
        labels: one int per rank, equal for ranks that share a host.

    Returns:
        dict with hosts (each host's ranks, in host order), host, local,
        order and pos (per rank / position), two_level, and owners
        (owners[h][j]: the rank owning slice j of max_local on host h).
    """
    cdef int n = len(labels)
    if n < 1:
        raise ValueError("topology needs at least one rank")
    cdef int *lab = <int *>malloc(sizeof(int) * n)
    cdef coll_topo_t t
    if lab == NULL:
        raise MemoryError()
    try:
        for i in range(n):
            lab[i] = int(labels[i])
        if coll_topo_build(&t, n, lab) != 0:
            raise MemoryError()
    finally:
        free(lab)
    try:
        hosts = [[t.order[v] for v in range(t.first[h], t.first[h + 1])] for h in range(t.nhosts)]
        return {"hosts": hosts, "host": [t.host[r] for r in range(n)],
                "local": [t.local[r] for r in range(n)],
                "order": [t.order[v] for v in range(n)], "pos": [t.pos[r] for r in range(n)],
                "min_local": t.min_local, "max_local": t.max_local,
                "two_level": bool(coll_topo_two_level(&t)),
                "owners": [[coll_topo_owner(&t, h, j) for j in range(t.max_local)]
                           for h in range(t.nhosts)]}
    finally:
        coll_topo_free(&t)


def dryrun(str collective, labels, int rank, str algorithm, size_t count, str dtype="float32",
           size_t segment_bytes=0, bint in_place=False) -> tuple:
    """Rank `rank`'s schedule for a world of host labels, built without a socket.

    collective: "allreduce" (sum of count elements), "allgather" (count
    elements per rank; in place: each rank's block already in its place in
    the output) or "reduce_scatter" (sum of n blocks of count; out is the
    scratch, rank r's block ends at r * count); algorithm ring or two_level
    for the last two.

    Returns:
        (steps, edges): steps as tuples (kind, peer, nbytes, offset, src_buf,
        src_off, dst_buf, dst_off) with kind 0 send, 1 recv, 2 recv_reduce,
        3 copy and buffer 0 in, 1 out, -1 none; edges as (pred, succ).
    """
    if algorithm not in ALGORITHMS or algorithm == "auto":
        raise ValueError(f"unknown algorithm {algorithm!r}")
    if collective not in ("allreduce", "allgather", "reduce_scatter"):
        raise ValueError(f"unknown collective {collective!r}")
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}")
    cdef int n = len(labels)
    cdef int *lab = <int *>malloc(sizeof(int) * max(n, 1))
    cdef int kind = {"allreduce": COLL_KIND_ALLREDUCE, "allgather": COLL_KIND_ALLGATHERV,
                     "reduce_scatter": COLL_KIND_REDUCE_SCATTER}[collective]
    cdef size_t esize = coll_dtype_size(DTYPES[dtype]) if dtype in DTYPES else 1
    cdef size_t nout = count * esize * (1 if kind == COLL_KIND_ALLREDUCE else n) + 1
    cdef char *out = <char *>malloc(nout)
    cdef char *inp = out if in_place else <char *>malloc(nout)
    cdef long long *steps = NULL
    cdef int *edges = NULL
    cdef int nsteps = 0, nedges = 0
    cdef coll_result_t res
    try:
        if lab == NULL or inp == NULL or out == NULL:
            raise MemoryError()
        for i in range(n):
            lab[i] = int(labels[i])
        if in_place and kind == COLL_KIND_ALLGATHERV and 0 <= rank < n:
            inp = out + <size_t>rank * count * esize  # the block in its place
        res = coll_dryrun(n, lab, rank, kind, ALGORITHMS[algorithm], count, DTYPES[dtype],
                          segment_bytes, inp, out, &steps, &nsteps, &edges, &nedges)
        if res != COLL_SUCCESS:
            raise ValueError(f"dry run failed: {coll_strerror(res).decode()}")
        return ([tuple(steps[8 * i + k] for k in range(8)) for i in range(nsteps)],
                [(edges[2 * i], edges[2 * i + 1]) for i in range(nedges)])
    finally:
        free(steps)
        free(edges)
        free(lab)
        if not in_place:
            free(inp)
        free(out)
