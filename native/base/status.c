/*
 * status.c -- result codes and algorithm ids as text, the communicator's
 * error text (written once, where the error is born), and the monotonic clock
 * every layer's deadlines use. The algorithm names live here, not in the
 * registry (algorithms/tune.c), because the wire layer names algorithms in its
 * mismatch errors and may not call up into the algorithms.
 */
#include <stdarg.h>
#include <stdio.h>
#include <time.h>

#include "base/comm_state.h"
#include "base/status.h"

double coll_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

const char *coll_algo_name(coll_algo_t algo) {
  switch (algo) {
    case COLL_ALGO_AUTO: return "auto";
    case COLL_ALGO_RING: return "ring";
    case COLL_ALGO_TREE: return "tree";
    case COLL_ALGO_BUTTERFLY: return "butterfly";
    case COLL_ALGO_TWO_LEVEL: return "two_level";
    case COLL_NUM_ALGOS: break;
  }
  return "?";
}

const char *coll_strerror(coll_result_t res) {
  switch (res) {
    case COLL_SUCCESS: return "success";
    case COLL_INVALID_ARGUMENT: return "invalid argument";
    case COLL_INVALID_USAGE: return "invalid usage";
    case COLL_SYSTEM_ERROR: return "system error";
    case COLL_REMOTE_ERROR: return "remote error";
    case COLL_TIMEOUT: return "timeout";
    case COLL_INTERNAL_ERROR: return "internal error";
    case COLL_CUDA_ERROR: return "CUDA error";
  }
  return "unknown error";
}

coll_result_t coll_error(coll_comm_t *comm, coll_result_t code, const char *fmt, ...) {
  if (comm && !comm->err_set) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(comm->err, sizeof comm->err, fmt, ap);
    va_end(ap);
    comm->err_set = 1;
    COLL_INFO(COLL_LOG_COLL, "error: %s", comm->err);
  }
  return code;
}
