/*
 * shm_priv.h -- the shared-memory link's segment layout and per-link state,
 * shared by transport/shm.c (rings, doorbells, setup) and transport/shm_cma.c
 * (single copy of large messages with process_vm_readv).
 */
#ifndef COLL_SHM_PRIV_H
#define COLL_SHM_PRIV_H

#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>

#include "transport/transport.h"

typedef struct {
  _Atomic uint64_t head; /* bytes written, by the writer */
  char pad0[56];
  _Atomic uint64_t tail; /* bytes consumed, by the reader */
  char pad1[56];
  _Atomic uint32_t reader_waiting;
  _Atomic uint32_t writer_waiting;
  char pad2[56];
  /* Single-copy descriptors of this ring's writer that the reader has
   * finished reading (shm_cma.c): the writer's buffer is free again once
   * this reaches the number it posted. */
  _Atomic uint64_t acked;
  char pad3[56];
} ring_ctl_t;

#define SEG_MAGIC 0x4d48534cu /* "LSHM" */

typedef struct {
  uint32_t magic;
  uint32_t ring_bytes;
  uint64_t token;
  /* Written by each side (0: the lower rank, which creates the segment)
   * before the link is used: its pid, the address it mapped this segment at
   * (a peer's probe reads the token there), and whether it can read the
   * other side's memory (set after its probe; 0 until then). */
  int32_t pid[2];
  uint64_t addr[2];
  _Atomic uint32_t can_read[2];
  char pad[16];
  ring_ctl_t ctl[2];
  /* then ring 0 data, ring 1 data */
} seg_t;

typedef struct {
  seg_t *seg;
  size_t map_bytes;
  size_t ring;          /* bytes per ring, a power of two */
  ring_ctl_t *out_ctl, *in_ctl;
  unsigned char *out, *in;
  char path[80];        /* connecting side, until settled */
  int wake_in, wake_out; /* my doorbell FIFO, the peer's */
  int dead;             /* the socket reported EOF */
  int side;             /* 0: the lower rank of the link, 1: the higher */
  /* Single copy (shm_cma.c). */
  int cma_read;         /* this side may read the peer's memory */
  int peer_pidfd;       /* the peer's pidfd (-1: none): tells a read from a reused pid */
  pid_t peer_pid;
  uint64_t posted;      /* descriptors this side sent on its ring */
} shm_t;

/* Wakes the peer if it sleeps on the flag (shm.c). */
void coll_shm_wake_if_waiting(coll_link_t *link, _Atomic uint32_t *waiting);
coll_result_t coll_shm_dead(coll_link_t *link);

/* shm_cma.c: run by each side once the segment is mapped on both (the
 * accepting side in take_offer, the connecting side when settled): reads the
 * peer's token through process_vm_readv and publishes whether it could. */
void coll_shm_cma_probe(coll_link_t *link);
void coll_shm_cma_close(shm_t *s);
int coll_shm_sc_wanted(coll_link_t *link, size_t n);
void coll_shm_sc_post(coll_link_t *link, const void *src, size_t n, uint8_t *desc);
coll_result_t coll_shm_sc_acked(coll_link_t *link, int *acked);
coll_result_t coll_shm_sc_read(coll_link_t *link, const uint8_t *desc, size_t expect, size_t off,
                               void *dst, size_t len);
void coll_shm_sc_done(coll_link_t *link);
int coll_shm_sc_can_read(coll_link_t *link);
/* Nonzero while a descriptor this side posted waits for the peer's ack. */
int coll_shm_sc_waiting(coll_link_t *link);

#endif
