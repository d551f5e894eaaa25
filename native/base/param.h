/*
 * param.h -- every tunable is one declaration in param.c: COLLECTIVES_* name,
 * default, one-line description; read once and cached. The README's table is
 * generated from the same list (collectives._core.params()). Entries read by
 * the Python layer (IFNAME, STORE_ADDR, ...) are declared here too so that
 * the list is complete in one place.
 */
#ifndef COLL_PARAM_H
#define COLL_PARAM_H

typedef enum {
  COLL_PARAM_TIMEOUT,
  COLL_PARAM_SEGMENT_BYTES,
  COLL_PARAM_SOCKET_BUFFER,
  COLL_PARAM_ALGO,
  COLL_PARAM_TUNE_FILE,
  COLL_PARAM_DEBUG,
  COLL_PARAM_DEBUG_SUBSYS,
  COLL_PARAM_IFNAME,
  COLL_PARAM_STORE_ADDR,
  COLL_PARAM_TRANSPORT,
  COLL_PARAM_SHM_BYTES,
  COLL_PARAM_SPIN_US,
  COLL_PARAM_BIND,
  COLL_PARAM_RANK,
  COLL_PARAM_SIZE,
  COLL_PARAM_LOCAL_RANK,
  COLL_PARAM_LOCAL_SIZE,
  COLL_PARAM_START_TIMEOUT,
  COLL_PARAM_JOB_SECRET,
  COLL_PARAM_JOB_SECRET_FILE,
  COLL_PARAM_REQUIRE_AUTH,
  COLL_PARAM_FUSION_THRESHOLD,
  COLL_PARAM_CACHE_DIR,
  COLL_PARAM_CUDA,
  COLL_PARAM_CUDA_IPC,
  COLL_PARAM_CUDA_SEGMENT_BYTES,
  COLL_PARAM_CUDA_FAKE,
  COLL_PARAM_CUDA_SMALL_BYTES,
  COLL_PARAM_CUDA_IPC_EVENTS,
  COLL_PARAM_CUDA_IPC_SLOTS,
  COLL_PARAM_CUDA_IPC_FAULT,
  COLL_PARAM_P2P_BUFFER_BYTES,
  COLL_PARAM_PS_SERVERS,
  COLL_PARAM_ELASTIC_ID,
  COLL_PARAM_SHM_SINGLE_COPY,
  COLL_PARAM_SHM_CMA_FAULT,
  COLL_PARAM_STORE_EXTERNAL,
  COLL_PARAM_NSOCKS,
  COLL_PARAM_PICKLE,
  COLL_PARAM_ENCRYPT,
  COLL_PARAM_CRYPTO_LIB,
  COLL_PARAM_ENCRYPT_FAULT,
  COLL_PARAM_STALL_WARN,
  COLL_NUM_PARAMS
} coll_param_id_t;

/* The value as text: the environment's, else the default. Cached. */
const char *coll_param_str(coll_param_id_t id);
long long coll_param_int(coll_param_id_t id);   /* accepts suffixes K, M, G */
double coll_param_double(coll_param_id_t id);

#endif
