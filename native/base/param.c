/* param.c -- the declared tunables (see param.h). */
#include "base/param.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "coll.h"

/* `allowed` is both the README's "allowed" column and the rule that
 * collectives.config.check_env applies to the variable before the rendezvous;
 * its small grammar ("one of: a, b", "list of: ...", "seconds > 0",
 * "[power-of-two ]bytes[ > 0][, LO to HI][, or auto]", "microseconds >= 0",
 * "integer >= N", "integer, N to M", "host:port", free text starting with "a "/"an ") is
 * parsed there, and a test fails on any entry it cannot parse. */
typedef struct {
  const char *name;
  const char *def;
  const char *desc;
  const char *allowed;
} coll_param_decl_t;

static const coll_param_decl_t params[COLL_NUM_PARAMS] = {
    [COLL_PARAM_TIMEOUT] = {"COLLECTIVES_TIMEOUT", "300",
                            "seconds a collective waits on a peer before failing", "seconds > 0"},
    [COLL_PARAM_SEGMENT_BYTES] = {"COLLECTIVES_SEGMENT_BYTES", "auto",
                                  "pipelining segment size of ring, tree and chain schedules (auto: "
                                  "512K, or 1M when some host of the job runs more ranks than cores "
                                  "and a peer is reached over TCP)", "bytes > 0, or auto"},
    [COLL_PARAM_SOCKET_BUFFER] = {"COLLECTIVES_SOCKET_BUFFER", "auto",
                                  "SO_SNDBUF/SO_RCVBUF of each TCP link (0: kernel autotuning; "
                                  "auto: 4M, or autotuning when the host runs more ranks than "
                                  "cores)", "bytes, or auto"},
    [COLL_PARAM_ALGO] = {"COLLECTIVES_ALGO", "",
                         "force an allreduce algorithm: ring, tree, butterfly, two_level "
                         "(overrides auto; ring, tree or butterfly: flat even across hosts)",
                         "one of: ring, tree, butterfly, two_level, auto"},
    [COLL_PARAM_TUNE_FILE] = {"COLLECTIVES_TUNE_FILE", "",
                              "table written by collectives-bench --tune that auto reads",
                              "a file path"},
    [COLL_PARAM_DEBUG] = {"COLLECTIVES_DEBUG", "WARN", "log level: NONE, WARN or INFO",
                          "one of: NONE, OFF, WARN, INFO, TRACE"},
    [COLL_PARAM_DEBUG_SUBSYS] = {"COLLECTIVES_DEBUG_SUBSYS", "ALL",
                                 "INFO subsystems: INIT,NET,COLL,TUNE,CUDA or ALL",
                                 "list of: INIT, NET, COLL, TUNE, CUDA, ALL"},
    [COLL_PARAM_IFNAME] = {"COLLECTIVES_IFNAME", "",
                           "network interface whose address the ranks advertise (like NCCL_SOCKET_IFNAME)",
                           "an interface name"},
    [COLL_PARAM_STORE_ADDR] = {"COLLECTIVES_STORE_ADDR", "",
                               "host:port of the rendezvous store hosted by rank 0", "host:port"},
    [COLL_PARAM_TRANSPORT] = {"COLLECTIVES_TRANSPORT", "",
                              "force one transport for every peer: tcp or shm (same-host peers)",
                              "one of: tcp, shm"},
    [COLL_PARAM_SHM_BYTES] = {"COLLECTIVES_SHM_BYTES", "4M",
                              "ring size per direction of a shared-memory link (a power of two)",
                              "power-of-two bytes, 64K to 1G"},
    [COLL_PARAM_SPIN_US] = {"COLLECTIVES_SPIN_US", "auto",
                            "microseconds a waiting rank keeps checking before it sleeps in poll() "
                            "(auto: 100), up to 10 times as long while the host's cores are idle; it "
                            "yields its core between checks when the host runs more ranks than cores", "microseconds >= 0, or auto"},
    [COLL_PARAM_BIND] = {"COLLECTIVES_BIND", "auto",
                         "pin each rank to one CPU of its affinity mask, local rank i to the i-th: "
                         "auto when the host runs more ranks than CPUs, core always, none never",
                         "one of: auto, core, none"},
    [COLL_PARAM_RANK] = {"COLLECTIVES_RANK", "", "this process's rank (set by collectives-run)",
                         "integer >= 0"},
    [COLL_PARAM_SIZE] = {"COLLECTIVES_SIZE", "", "number of ranks (set by collectives-run)",
                         "integer >= 1"},
    [COLL_PARAM_LOCAL_RANK] = {"COLLECTIVES_LOCAL_RANK", "",
                               "rank among this host's processes (set by collectives-run)",
                               "integer >= 0"},
    [COLL_PARAM_LOCAL_SIZE] = {"COLLECTIVES_LOCAL_SIZE", "",
                               "processes on this host (set by collectives-run)", "integer >= 1"},
    [COLL_PARAM_START_TIMEOUT] = {"COLLECTIVES_START_TIMEOUT", "",
                                  "seconds to wait for every rank at start-up (default: COLLECTIVES_TIMEOUT)",
                                  "seconds > 0"},
    [COLL_PARAM_JOB_SECRET] = {"COLLECTIVES_JOB_SECRET", "",
                               "the job's secret (16+ bytes, equal on every rank; collectives-run "
                               "makes one): the store, link openings and abort notices prove it",
                               "a secret of 16+ bytes"},
    [COLL_PARAM_JOB_SECRET_FILE] = {"COLLECTIVES_JOB_SECRET_FILE", "",
                                    "a file holding the job secret (read when "
                                    "COLLECTIVES_JOB_SECRET is unset; chmod 600)", "a file path"},
    [COLL_PARAM_REQUIRE_AUTH] = {"COLLECTIVES_REQUIRE_AUTH", "0",
                                 "1: refuse to start without a job secret (else a rank warns once "
                                 "that the job is unauthenticated)", "one of: 0, 1"},
    [COLL_PARAM_FUSION_THRESHOLD] = {"COLLECTIVES_FUSION_THRESHOLD", "128M",
                                     "collectives.torch: bytes per gradient fusion buffer (0: no fusion)",
                                     "bytes"},
    [COLL_PARAM_CACHE_DIR] = {"COLLECTIVES_CACHE_DIR", "~/.cache/collectives",
                              "collectives.jax: where the FFI handler compiled on first use is kept",
                              "a directory path"},
    [COLL_PARAM_CUDA] = {"COLLECTIVES_CUDA", "auto",
                         "build time: 1 builds the CUDA parts (fails without nvcc), 0 skips them, "
                         "auto builds them when nvcc is found", "one of: auto, 0, 1"},
    [COLL_PARAM_CUDA_IPC] = {"COLLECTIVES_CUDA_IPC", "1",
                             "GPU buffers of same-host ranks: 1 reads peers' memory over CUDA IPC, "
                             "0 stages through pinned host memory", "one of: 0, 1"},
    [COLL_PARAM_CUDA_SEGMENT_BYTES] = {"COLLECTIVES_CUDA_SEGMENT_BYTES", "64M",
                                       "pipelining segment size of collectives on GPU buffers",
                                       "bytes > 0"},
    [COLL_PARAM_CUDA_FAKE] = {"COLLECTIVES_CUDA_FAKE", "0",
                              "tests only: 1 emulates one GPU in host memory, so that the GPU code "
                              "paths run on machines without one", "one of: 0, 1"},
    [COLL_PARAM_CUDA_SMALL_BYTES] = {"COLLECTIVES_CUDA_SMALL_BYTES", "16K",
                                     "collectives on GPU buffers up to this many bytes are copied "
                                     "whole to pinned host memory and run on the host path (0: never)",
                                     "bytes"},
    [COLL_PARAM_CUDA_IPC_EVENTS] = {"COLLECTIVES_CUDA_IPC_EVENTS", "1",
                                    "CUDA IPC links: 1 orders each segment by interprocess events "
                                    "on the GPU streams, so segments run back to back; 0 waits on "
                                    "the host for each segment's read (a round trip per segment)",
                                    "one of: 0, 1"},
    [COLL_PARAM_CUDA_IPC_SLOTS] = {"COLLECTIVES_CUDA_IPC_SLOTS", "16",
                                   "interprocess events per CUDA IPC link and direction: how many "
                                   "segments' signals may be outstanding before one is re-recorded",
                                   "integer, 1 to 64"},
    [COLL_PARAM_CUDA_IPC_FAULT] = {"COLLECTIVES_CUDA_IPC_FAULT", "0",
                                   "tests only: nowait makes a reader skip the wait on the sender's "
                                   "event, noack makes a sender skip the wait on the reader's event "
                                   "(the emulated GPU must then show wrong bytes)",
                                   "one of: 0, nowait, noack"},
    [COLL_PARAM_P2P_BUFFER_BYTES] = {"COLLECTIVES_P2P_BUFFER_BYTES", "64M",
                                     "point-to-point messages that arrive before their receive "
                                     "is posted are kept up to this many bytes in all; later "
                                     "ones wait in the link", "bytes > 0"},
    [COLL_PARAM_PS_SERVERS] = {"COLLECTIVES_PS_SERVERS", "",
                               "collectives.ps: how many ranks (the last ones) are parameter "
                               "servers (set by collectives-run --servers)", "integer >= 1"},
    [COLL_PARAM_ELASTIC_ID] = {"COLLECTIVES_ELASTIC_ID", "",
                               "collectives-run --elastic: this worker's id, which stays while its "
                               "rank changes from one world to the next (set by the launcher)",
                               "integer >= 0"},
    [COLL_PARAM_SHM_SINGLE_COPY] = {"COLLECTIVES_SHM_SINGLE_COPY", "auto",
                                    "shared-memory messages from this many bytes up that the "
                                    "receiver copies (not reduces) are read once, straight from "
                                    "the sender's memory (process_vm_readv), where the kernel "
                                    "permits it (0: never; auto: 256K, never on a host that runs "
                                    "more ranks than cores)",
                                    "bytes, or auto"},
    [COLL_PARAM_SHM_CMA_FAULT] = {"COLLECTIVES_SHM_CMA_FAULT", "0",
                                  "tests only: refuse makes the single-copy probe fail as if "
                                  "ptrace were not permitted; overlong makes descriptors claim "
                                  "more bytes than the message has", "one of: 0, refuse, overlong"},
    [COLL_PARAM_STORE_EXTERNAL] = {"COLLECTIVES_STORE_EXTERNAL", "0",
                                   "1: a launcher hosts the store at the store address for the "
                                   "whole job, so rank 0 starts none and collectives.shrink() "
                                   "works after rank 0 died (set by such a launcher)",
                                   "one of: 0, 1"},
    [COLL_PARAM_NSOCKS] = {"COLLECTIVES_NSOCKS", "1",
                           "TCP connections per link between two ranks; each segment is striped "
                           "over them in 64K units, round robin (equal on every rank; more than 1 "
                           "helps only where one flow cannot fill the NIC)",
                           "integer, 1 to 16"},
    [COLL_PARAM_PICKLE] = {"COLLECTIVES_PICKLE", "auto",
                           "what the object collectives (bcast, allgather, recv...) unpickle from "
                           "peers: auto loads anything in a job with a secret and plain data "
                           "only (numbers, strings, containers, arrays, tensors) without one; "
                           "plain always restricts; any never does",
                           "one of: auto, plain, any"},
    [COLL_PARAM_ENCRYPT] = {"COLLECTIVES_ENCRYPT", "0",
                            "1: encrypt and authenticate every TCP link (AES-256-GCM, keys per "
                            "connection and direction from the job secret, which it requires; "
                            "shared-memory links stay as they are); equal on every rank",
                            "one of: 0, 1"},
    [COLL_PARAM_CRYPTO_LIB] = {"COLLECTIVES_CRYPTO_LIB", "libcrypto.so.3",
                               "the OpenSSL 3 libcrypto that COLLECTIVES_ENCRYPT=1 loads (a name "
                               "the dynamic loader finds, or a path)", "a library name or path"},
    [COLL_PARAM_ENCRYPT_FAULT] = {"COLLECTIVES_ENCRYPT_FAULT", "0",
                                  "tests only: the lower rank of each encrypted link alters its "
                                  "4th record on the wire: flip a ciphertext bit, replay the "
                                  "record before it, or claim an overlong length; rekey (on "
                                  "every rank): keys change every 3 records",
                                  "one of: 0, flip, replay, length, rekey"},
    [COLL_PARAM_STALL_WARN] = {"COLLECTIVES_STALL_WARN", "auto",
                               "seconds a blocking collective may wait without progress before it "
                               "warns, naming the ranks it waits for (then again each as long, "
                               "until the timeout); auto: a quarter of the call's timeout, at "
                               "least 5; 0: never", "seconds >= 0, or auto"},
};

static pthread_once_t once = PTHREAD_ONCE_INIT;
static const char *values[COLL_NUM_PARAMS];

static void read_all(void) {
  for (int i = 0; i < COLL_NUM_PARAMS; i++) {
    const char *v = getenv(params[i].name);
    values[i] = (v && v[0]) ? strdup(v) : params[i].def;
  }
}

const char *coll_param_str(coll_param_id_t id) {
  pthread_once(&once, read_all);
  return values[id];
}

long long coll_param_int(coll_param_id_t id) {
  const char *s = coll_param_str(id);
  char *end = NULL;
  long long v = strtoll(s, &end, 10);
  if (end && (*end == 'k' || *end == 'K')) v <<= 10;
  if (end && (*end == 'm' || *end == 'M')) v <<= 20;
  if (end && (*end == 'g' || *end == 'G')) v <<= 30;
  return v;
}

double coll_param_double(coll_param_id_t id) { return strtod(coll_param_str(id), NULL); }

int coll_param_count(void) { return COLL_NUM_PARAMS; }
const char *coll_param_name(int i) { return (i >= 0 && i < COLL_NUM_PARAMS) ? params[i].name : NULL; }
const char *coll_param_default(int i) { return (i >= 0 && i < COLL_NUM_PARAMS) ? params[i].def : NULL; }
const char *coll_param_description(int i) {
  return (i >= 0 && i < COLL_NUM_PARAMS) ? params[i].desc : NULL;
}
const char *coll_param_allowed(int i) {
  return (i >= 0 && i < COLL_NUM_PARAMS) ? params[i].allowed : NULL;
}
