/*
 * status.h -- errors: coll_result_t codes (coll.h), the per-communicator
 * error text, and the five check macros.
 *
 * The message is written once, where the error is born (coll_error), with
 * rank, peer, op, seq and both sides' values; callers above only propagate
 * the code with COLL_CHECK / COLL_CHECK_GOTO, which add an INFO backtrace line.
 */
#ifndef COLL_STATUS_H
#define COLL_STATUS_H

#include <errno.h>
#include <string.h>

#include "coll.h"
#include "base/log.h"

/* Records the error text on comm (the first error of a call wins, so the
 * cascade that follows a failure does not hide its cause) and returns code. */
coll_result_t coll_error(coll_comm_t *comm, coll_result_t code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define COLL_CHECK(call)                                                        \
  do {                                                                          \
    coll_result_t res_ = (call);                                                \
    if (res_ != COLL_SUCCESS) {                                                 \
      COLL_INFO(COLL_LOG_COLL, "%s:%d -> %s", __FILE__, __LINE__, coll_strerror(res_)); \
      return res_;                                                              \
    }                                                                           \
  } while (0)

#define COLL_CHECK_GOTO(call, res, label)                                       \
  do {                                                                          \
    (res) = (call);                                                             \
    if ((res) != COLL_SUCCESS) {                                                \
      COLL_INFO(COLL_LOG_COLL, "%s:%d -> %s", __FILE__, __LINE__, coll_strerror(res)); \
      goto label;                                                               \
    }                                                                           \
  } while (0)

/* Runs a syscall that returns < 0 on failure, retrying EINTR; on any other
 * failure records "<name> failed: <errno text>" on comm and returns. */
#define COLL_SYSCHECK(comm, retval, call, name)                                 \
  do {                                                                          \
    do { (retval) = (call); } while ((retval) < 0 && errno == EINTR);           \
    if ((retval) < 0)                                                           \
      return coll_error((comm), COLL_SYSTEM_ERROR, "%s failed: %s", (name), strerror(errno)); \
  } while (0)

/* The CUDA check is defined by the CUDA sources when they are built. */

#endif
