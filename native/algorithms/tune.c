/*
 * tune.c -- the registry of allreduce algorithms and the one place AUTO
 * chooses among them.
 *
 * The choice reads a transport x nranks x size table: the built-in one below
 * (measured on a 2-core loopback machine with collectives-bench --tune) or
 * the file named by COLLECTIVES_TUNE_FILE, whose lines are
 *     <nranks> <max_bytes> <algorithm> [tcp|shm]
 * meaning "for this rank count (over this transport; both without it),
 * messages up to max_bytes use algorithm"; among the lines of our transport,
 * the first matching line for the nearest rank count not above ours wins.
 * COLLECTIVES_ALGO forces one algorithm for every size.
 *
 * A fourth field HxL (e.g. 2x4) keys rows to a topology instead of a
 * transport: H hosts, the most populous running L ranks. They are the rows a
 * communicator in two levels reads (coll_topo_two_level: H >= 2, L >= 2),
 * written by collectives-bench --tune run on such a cluster, which measures
 * two_level against the flat algorithms (over the host order) per size; a
 * tuned table can so pick flat where flat wins. Without a row for its shape
 * such a communicator goes two_level at every size (the topology rule below).
 *
 * The transport key matters because the two cost models differ: a shm link
 * copies each byte once and wakes a peer cheaply, a TCP link copies twice
 * through the kernel and pays a system call per message, so they favour
 * different algorithms at mid sizes. A communicator's key is "shm" when every
 * link will be shared memory -- all peers on our host and COLLECTIVES_TRANSPORT
 * not tcp -- and "tcp" otherwise (coll_links_all_shm: predicted from the host
 * ids, so choosing opens no link; a shm offer refused at connect time still
 * reads the shm rows).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <pthread.h>

#include "algorithms/algorithms.h"
#include "algorithms/topology.h"
#include "base/comm_state.h"
#include "base/log.h"
#include "base/param.h"
#include "transport/transport.h"

static const coll_algo_entry_t registry[COLL_NUM_ALGOS] = {
    [COLL_ALGO_AUTO] = {COLL_ALGO_AUTO, "chosen by size and rank count", NULL},
    [COLL_ALGO_RING] = {COLL_ALGO_RING,
                        "reduce-scatter + allgather around a ring, segmented; bandwidth-optimal",
                        coll_allreduce_ring},
    [COLL_ALGO_TREE] = {COLL_ALGO_TREE, "pipelined binary-tree reduce then broadcast",
                        coll_allreduce_tree},
    [COLL_ALGO_BUTTERFLY] = {COLL_ALGO_BUTTERFLY,
                             "recursive halving/doubling; latency-optimal for small messages",
                             coll_allreduce_butterfly},
    [COLL_ALGO_TWO_LEVEL] = {COLL_ALGO_TWO_LEVEL,
                             "reduce inside each host, allreduce across hosts on rails, "
                             "broadcast inside each host; pipelined",
                             coll_allreduce_two_level},
};

const coll_algo_entry_t *coll_algo_entry(coll_algo_t id) {
  return (id >= 0 && id < COLL_NUM_ALGOS) ? &registry[id] : NULL;
}

typedef enum { TUNE_ANY, TUNE_SHM, TUNE_TCP, TUNE_TOPO } tune_transport_t;

/* What a lookup matches rows against: a transport, or (TUNE_TOPO) a shape. */
typedef struct {
  tune_transport_t transport;
  int hosts, per_host;
} tune_key_t;

typedef struct {
  int nranks;
  size_t max_bytes;
  coll_algo_t algo;
  tune_transport_t transport;
  int hosts, per_host; /* TUNE_TOPO rows only */
} tune_row_t;

/* Built-in table; rows for a rank count apply to that count and above until
 * the next listed count, and a row without a transport to both. From
 * collectives-bench --tune on a 2-core VM (loopback, ranks on one host),
 * four sweeps per (transport, rank count), smoothed where algorithms are
 * within the noise of each other (about 10% there):
 *   - butterfly's log2(n) rounds win for small messages everywhere;
 *   - 2 ranks over shm: the ring's pipelined segments win from 2 MiB (about
 *     1.2x butterfly at 2 MiB; within 5% of each other above);
 *   - 2 ranks over tcp: butterfly up to 2 MiB, then the ring. On one VM
 *     the tree (a pipelined reduce to rank 0 whose result streams straight
 *     back) was 1.2x ahead at 8-128 MiB; on another it was the slowest of
 *     the three at 8, 32 and 128 MiB (0.7-0.9x the ring, with up to 25 %
 *     more CPU per call: rank 0 does every reduction), and across two
 *     network namespaces at 1 Gbit/s it fell to 0.110-0.116 GB/s busbw at
 *     16-64 MiB where ring and butterfly hold the link's 0.1195;
 *   - 4 ranks: butterfly up to 512 KiB over tcp and 64 KiB over shm, the
 *     ring above. Since ranks on an oversubscribed host are pinned round
 *     robin (COLLECTIVES_BIND), a ring's neighbours sit on different cores
 *     and the ring took 1.1-1.4x less time than butterfly at 1-4 MiB over
 *     tcp and 128 KiB-2 MiB over shm (four and three interleaved runs;
 *     unpinned, butterfly had been ahead up to 1-2 MiB), and across hosts
 *     the ring wins there too: 4 network namespaces with
 *     1 Gbit/s links (bench/netns.sh) gave ring 0.119 GB/s busbw against
 *     butterfly 0.101 at 16 MiB, equal at 2 MiB, where each of butterfly's
 *     rounds waits for the last and the link idles between them; the ring
 *     also wins from 32 MiB on loopback (1.05-2x butterfly, whose halving
 *     exchanges with a far partner contend for the same 2 cores).
 *   - 5+ ranks over tcp: butterfly up to 1 MiB (1.2-1.5x the ring at
 *     8 ranks, pinned, 64 KiB-1 MiB), the ring from 4 MiB.
 * 3 ranks, and 5+ over shm, keep the earlier shm-measured rows (8 ranks
 * pinned over shm agreed: butterfly up to 256 KiB, the ring from 1 MiB). */
static const tune_row_t builtin[] = {
    {2, 1u << 20, COLL_ALGO_BUTTERFLY, TUNE_SHM},
    {2, (size_t)-1, COLL_ALGO_RING, TUNE_SHM},
    {2, 2u << 20, COLL_ALGO_BUTTERFLY, TUNE_TCP},
    {2, (size_t)-1, COLL_ALGO_RING, TUNE_TCP},
    {3, 128u << 10, COLL_ALGO_BUTTERFLY, TUNE_ANY},
    {3, (size_t)-1, COLL_ALGO_RING, TUNE_ANY},
    {4, 64u << 10, COLL_ALGO_BUTTERFLY, TUNE_SHM},
    {4, 512u << 10, COLL_ALGO_BUTTERFLY, TUNE_TCP},
    {4, (size_t)-1, COLL_ALGO_RING, TUNE_ANY},
    {5, 256u << 10, COLL_ALGO_BUTTERFLY, TUNE_SHM},
    {5, 1u << 20, COLL_ALGO_BUTTERFLY, TUNE_TCP},
    {5, (size_t)-1, COLL_ALGO_RING, TUNE_ANY},
};

static pthread_once_t once = PTHREAD_ONCE_INIT;
static tune_row_t *table = NULL;
static int ntable = 0;
static coll_algo_t forced = COLL_ALGO_AUTO;

static coll_algo_t algo_by_name(const char *name) {
  for (int i = 1; i < COLL_NUM_ALGOS; i++)
    if (strcasecmp(name, coll_algo_name((coll_algo_t)i)) == 0) return (coll_algo_t)i;
  return COLL_ALGO_AUTO;
}

static void load(void) {
  const char *f = coll_param_str(COLL_PARAM_ALGO);
  if (f[0]) {
    forced = algo_by_name(f);
    if (forced == COLL_ALGO_AUTO && strcasecmp(f, "auto") != 0)
      COLL_WARN("COLLECTIVES_ALGO=%s is not an algorithm (ring, tree, butterfly, two_level); "
                "using auto", f);
  }
  const char *path = coll_param_str(COLL_PARAM_TUNE_FILE);
  if (path[0]) {
    FILE *fp = fopen(path, "r");
    if (!fp) {
      COLL_WARN("cannot read COLLECTIVES_TUNE_FILE %s; using the built-in table", path);
    } else {
      char line[256], name[64], tp[32];
      int cap = 0;
      while (fgets(line, sizeof line, fp)) {
        int nr;
        unsigned long long mb;
        tp[0] = 0;
        if (line[0] == '#' || sscanf(line, "%d %llu %63s %31s", &nr, &mb, name, tp) < 3) continue;
        coll_algo_t a = algo_by_name(name);
        if (a == COLL_ALGO_AUTO) continue;
        tune_transport_t t = TUNE_ANY;
        int hosts = 0, per_host = 0;
        char rest;
        if (strcasecmp(tp, "shm") == 0) t = TUNE_SHM;
        else if (strcasecmp(tp, "tcp") == 0) t = TUNE_TCP;
        else if (sscanf(tp, "%dx%d%c", &hosts, &per_host, &rest) == 2 && hosts >= 2 && per_host >= 2)
          t = TUNE_TOPO;
        else if (tp[0]) {
          COLL_WARN("%s: '%s' is neither a transport (tcp, shm) nor a shape HxL of two or more "
                    "hosts with two or more ranks (2x4); line ignored", path, tp);
          continue;
        }
        if (ntable == cap) {
          cap = cap ? 2 * cap : 32;
          tune_row_t *t = realloc(table, (size_t)cap * sizeof *t);
          if (!t) break;
          table = t;
        }
        table[ntable++] = (tune_row_t){nr, (size_t)mb, a, t, hosts, per_host};
      }
      fclose(fp);
      COLL_INFO(COLL_LOG_TUNE, "read %d rows from %s", ntable, path);
    }
  }
}

static int row_applies(const tune_row_t *row, tune_key_t k) {
  if (k.transport == TUNE_TOPO) /* only rows measured on this shape */
    return row->transport == TUNE_TOPO && row->hosts == k.hosts && row->per_host == k.per_host;
  return row->transport == TUNE_ANY || row->transport == k.transport;
}

static coll_algo_t lookup(const tune_row_t *t, int nt, int size, size_t nbytes, tune_key_t tp) {
  int best = -1;
  for (int i = 0; i < nt; i++)
    if (row_applies(&t[i], tp) && t[i].nranks <= size && t[i].nranks > best) best = t[i].nranks;
  if (best < 0) return COLL_ALGO_AUTO;
  for (int i = 0; i < nt; i++)
    if (row_applies(&t[i], tp) && t[i].nranks == best && nbytes <= t[i].max_bytes) return t[i].algo;
  return COLL_ALGO_AUTO;
}

static coll_algo_t choose(int size, size_t nbytes, tune_key_t tp) {
  pthread_once(&once, load);
  if (forced != COLL_ALGO_AUTO) return forced;
  coll_algo_t a = table ? lookup(table, ntable, size, nbytes, tp) : COLL_ALGO_AUTO;
  if (a == COLL_ALGO_AUTO)
    a = lookup(builtin, (int)(sizeof builtin / sizeof builtin[0]), size, nbytes, tp);
  return a == COLL_ALGO_AUTO ? COLL_ALGO_RING : a;
}

coll_algo_t coll_tune_choose_topo(const coll_topo_t *t, int size, size_t nbytes, int all_shm) {
  /* Two or more hosts, one running two or more ranks: the tuned rows of this
   * shape (HxL), else two levels at every size. Per host link it sends
   * 2(H-1)/H of the message against 2(n-1)/n for a flat ring, in 2(H-1)
   * network steps against 2(n-1) or 2 log2(n); on the namespace cluster at
   * 1 Gbit/s (bench/README.md, "Several ranks per host") 64 MiB took
   * 0.57-0.66x the flat ring's time at 2 hosts (0.91x at 4 x 2), and
   * 8 B - 64 KiB 0.37-0.45x the flat ring's at 2 x 4, level with the flat
   * butterfly there. COLLECTIVES_ALGO still wins. */
  pthread_once(&once, load);
  if (forced != COLL_ALGO_AUTO) return forced;
  if (coll_topo_two_level(t)) {
    tune_key_t k = {TUNE_TOPO, t->nhosts, t->max_local};
    coll_algo_t a = table ? lookup(table, ntable, size, nbytes, k) : COLL_ALGO_AUTO;
    return a == COLL_ALGO_AUTO ? COLL_ALGO_TWO_LEVEL : a;
  }
  return choose(size, nbytes, (tune_key_t){all_shm ? TUNE_SHM : TUNE_TCP, 0, 0});
}

coll_algo_t coll_tune_choose_comm(coll_comm_t *comm, size_t nbytes) {
  return coll_tune_choose_topo(coll_comm_topo(comm), comm->size, nbytes, coll_links_all_shm(comm));
}

int coll_tune_two_level(coll_comm_t *comm) {
  pthread_once(&once, load);
  if (forced != COLL_ALGO_AUTO && forced != COLL_ALGO_TWO_LEVEL) return 0;
  return coll_topo_two_level(coll_comm_topo(comm));
}

/* Without a communicator (collectives._core.tune_choose): a world of ranks on
 * one host, over the transport COLLECTIVES_TRANSPORT asks for. */
coll_algo_t coll_tune_choose(int size, size_t nbytes) {
  int tcp = strcasecmp(coll_param_str(COLL_PARAM_TRANSPORT), "tcp") == 0;
  return coll_tune_choose_topo(NULL, size, nbytes, !tcp);
}
