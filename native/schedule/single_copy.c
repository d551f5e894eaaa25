/*
 * schedule/single_copy.c -- the receiving end of a single-copy message
 * (transport.h's sc_* entries; shm over CMA in transport/shm_cma.c).
 *
 * After a header flagged COLL_WIRE_SC_DESC the link carries a descriptor
 * instead of the payload. Once it is whole, a plain receive reads the bytes
 * straight into its destination in one call; a reducing one reads them in
 * COLL_STAGE_BYTES pieces into the link's stage, which stays in L2 while it
 * is reduced into the destination (dst = local op incoming, as on the ring
 * path). Then the descriptor is acknowledged, which frees the sender's
 * buffer. The whole message moves in this call: it is already in memory,
 * so there is nothing to wait for.
 *
 * Senders use it only in collectives that do not reduce (allgather,
 * broadcast, gather, scatter, alltoall). A reduced message costs the ring
 * path one copy (the sender's into the ring; the receiver reduces straight
 * out of it) and this path one process_vm_readv, which on the 2-vCPU test
 * VM moves bytes slower than memcpy (3.9/6.8/7.9/3.2 GB/s against
 * 14.0/12.5/11.6/4.3 GB/s at 64K/256K/512K/4M, bench/README.md); a copied
 * message costs the ring two copies against one. The reducing branch below
 * stays for a peer that sends one anyway: the receiver never refuses a
 * descriptor it said it could read.
 */
#include <string.h>

#include "schedule/schedule.h"

#include "base/status.h"

coll_result_t coll_sched_sc_recv(coll_sched_t *s, coll_link_t *link, coll_step_t *st, uint8_t *desc,
                                 size_t *desc_got, int *moved, int *done) {
  *done = 0;
  while (*desc_got < COLL_SC_DESC_BYTES) {
    struct iovec iov = {desc + *desc_got, COLL_SC_DESC_BYTES - *desc_got};
    size_t n = 0;
    COLL_CHECK(coll_link_recv(link, &iov, 1, &n));
    if (n == 0) return COLL_SUCCESS;
    *desc_got += n;
    *moved = 1;
  }
  const coll_transport_t *tp = link->tp;
  if (st->kind == COLL_STEP_RECV_REDUCE) {
    for (size_t off = 0; off < st->nbytes;) {
      size_t len = st->nbytes - off < COLL_STAGE_BYTES ? st->nbytes - off : COLL_STAGE_BYTES;
      len -= len % s->elem;
      COLL_CHECK(tp->sc_read(link, desc, st->nbytes, off, link->stage, len));
      s->reduce((char *)st->dst + off, (const char *)st->src + off, link->stage, len / s->elem,
                NULL);
      off += len;
    }
  } else {
    COLL_CHECK(tp->sc_read(link, desc, st->nbytes, 0, st->dst, st->nbytes));
  }
  tp->sc_done(link);
  *moved = 1;
  *done = 1;
  return COLL_SUCCESS;
}
