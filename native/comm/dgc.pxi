# ---- the fused DGC pass (reduce/dgc_fused.h), used by collectives.torch.dgc ---------

from libc.stdint cimport int64_t, uint64_t

cdef extern from "reduce/dgc_fused.h" nogil:
    coll_result_t coll_dgc_sample(const float *g, const float *u, const float *v, size_t n,
                                  int mode, float momentum, float scale, size_t start,
                                  size_t stride, size_t s, float *out)
    coll_result_t coll_dgc_update(const float *g, float *u, float *v, size_t n, int mode,
                                  float momentum, float scale, const float *thr, size_t nthr,
                                  uint64_t *hist, size_t cap, float *cand_v, int64_t *cand_i,
                                  size_t *ncand)

_DGC_MODES = {"topk": 0, "momentum": 1, "nesterov": 2}


cdef int _dgc_check(str mode, _View gv, _View uv, _View vv) except -1:
    if mode not in _DGC_MODES:
        raise ValueError(f"mode must be one of {sorted(_DGC_MODES)}, got {mode!r}")
    cdef _View w
    for name, w in (("g", gv), ("v", vv)) + ((("u", uv),) if uv is not None else ()):
        if w.dtype != COLL_FLOAT32:
            raise TypeError(f"{name} must be float32")
        if w.count != gv.count:
            raise ValueError(f"{name} has {w.count} elements, g has {gv.count}")
    if uv is None and mode != "topk":
        raise ValueError(f"mode {mode!r} needs the momentum buffer u")
    _dgc_disjoint(vv, gv, "v", "g")
    if uv is not None:
        _dgc_disjoint(uv, gv, "u", "g")
        _dgc_disjoint(uv, vv, "u", "v")
    return 0


cdef int _dgc_disjoint(_View a, _View b, str na, str nb) except -1:
    cdef char *pa = <char *>a.ptr
    cdef char *pb = <char *>b.ptr
    if a.nbytes and b.nbytes and pa < pb + b.nbytes and pb < pa + a.nbytes:
        raise ValueError(f"dgc: {na} and {nb} overlap")
    return 0


def dgc_sample(g, u, v, str mode, double momentum, double scale, size_t start, size_t stride,
               out) -> None:
    """Write into float32 `out` the |v| that dgc_update would leave at positions start,
    start+stride, ... (len(out) of them), modifying nothing. u may be None for mode "topk"."""
    cdef _View gv = host_view(g, "g", False, None)
    cdef _View uv = None if u is None else host_view(u, "u", False, None)
    cdef _View vv = host_view(v, "v", False, None)
    cdef _View ov = host_view(out, "out", True, None)
    _dgc_check(mode, gv, uv, vv)
    if ov.dtype != COLL_FLOAT32:
        raise TypeError("out must be float32")
    if stride == 0:
        raise ValueError("stride must be >= 1")
    if ov.count and (start >= gv.count or (gv.count - 1 - start) // stride + 1 < ov.count):
        raise ValueError(f"{ov.count} samples from {start} every {stride} run past "
                         f"{gv.count} elements")
    cdef int m = _DGC_MODES[mode]
    cdef const float *up = NULL
    if uv is not None:
        up = <const float *>uv.ptr
    cdef coll_result_t res
    with nogil:
        res = coll_dgc_sample(<const float *>gv.ptr, up,
                              <const float *>vv.ptr, gv.count, m, <float>momentum, <float>scale,
                              start, stride, ov.count, <float *>ov.ptr)
    CHKERR(res, NULL)


def dgc_update(g, u, v, str mode, double momentum, double scale, thresholds, hist, cand_v,
               cand_i) -> int:
    """The fused DGC pass: update u, v in place (see reduce/dgc_fused.h), add to
    int64 `hist` the new |v| binned by the non-increasing float32 `thresholds`, and write the first
    len(cand_v) entries with |v| >= thresholds[-1] (float32 values, int64 indices) into
    cand_v / cand_i. Returns how many such entries there were (more than len(cand_v):
    the candidates overflowed). u may be None for mode "topk"."""
    cdef _View gv = host_view(g, "g", False, None)
    cdef _View uv = None if u is None else host_view(u, "u", True, None)
    cdef _View vv = host_view(v, "v", True, None)
    cdef _View tv = host_view(thresholds, "thresholds", False, None)
    cdef _View hv = host_view(hist, "hist", True, None)
    cdef _View cv = host_view(cand_v, "cand_v", True, None)
    cdef _View ci = host_view(cand_i, "cand_i", True, None)
    _dgc_check(mode, gv, uv, vv)
    if tv.dtype != COLL_FLOAT32 or cv.dtype != COLL_FLOAT32:
        raise TypeError("thresholds and cand_v must be float32")
    if ci.dtype != COLL_INT64:
        raise TypeError("cand_i must be int64")
    if hv.dtype != COLL_INT64 or hv.count != tv.count:
        raise TypeError("hist must be int64 with one entry per threshold")
    if tv.count == 0:
        raise ValueError("at least one threshold is needed")
    if cv.count != ci.count:
        raise ValueError(f"cand_v has {cv.count} entries, cand_i {ci.count}")
    cdef int m = _DGC_MODES[mode]
    cdef size_t ncand = 0
    cdef float *up = NULL
    if uv is not None:
        up = <float *>uv.ptr
    cdef coll_result_t res
    with nogil:
        res = coll_dgc_update(<const float *>gv.ptr, up,
                              <float *>vv.ptr, gv.count, m, <float>momentum, <float>scale,
                              <const float *>tv.ptr, tv.count, <uint64_t *>hv.ptr, cv.count,
                              <float *>cv.ptr, <int64_t *>ci.ptr, &ncand)
    if res == COLL_INVALID_ARGUMENT:
        raise ValueError("dgc_update: thresholds must be > 0 and non-increasing")
    CHKERR(res, NULL)
    return ncand
