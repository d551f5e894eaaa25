/*
 * log.h -- WARN always on; INFO when COLLECTIVES_DEBUG=INFO and the subsystem
 * is listed in COLLECTIVES_DEBUG_SUBSYS (INIT,NET,COLL,TUNE,CUDA or ALL).
 * Lines read "host:pid [rank] COLLECTIVES WARN file:line message". The level
 * test comes before any formatting, so a disabled INFO costs one branch.
 * The log configuration is one of the two process globals the core allows.
 */
#ifndef COLL_LOG_H
#define COLL_LOG_H

enum {
  COLL_LOG_INIT = 1,
  COLL_LOG_NET = 2,
  COLL_LOG_COLL = 4,
  COLL_LOG_TUNE = 8,
  COLL_LOG_CUDA = 16,
  COLL_LOG_ALL = 31
};

enum { COLL_LEVEL_NONE = 0, COLL_LEVEL_WARN = 1, COLL_LEVEL_INFO = 2 };

extern int coll_log_level;   /* set once by coll_log_init */
extern int coll_log_subsys;

void coll_log_init(void);
void coll_log_set_rank(int rank);
void coll_log(int level, int subsys, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

#define COLL_WARN(...)                                                          \
  do {                                                                          \
    if (coll_log_level >= COLL_LEVEL_WARN) coll_log(COLL_LEVEL_WARN, 0, __FILE__, __LINE__, __VA_ARGS__); \
  } while (0)

#define COLL_INFO(sub, ...)                                                     \
  do {                                                                          \
    if (coll_log_level >= COLL_LEVEL_INFO && (coll_log_subsys & (sub)))         \
      coll_log(COLL_LEVEL_INFO, (sub), __FILE__, __LINE__, __VA_ARGS__);        \
  } while (0)

#endif
