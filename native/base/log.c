/* log.c -- see log.h. */
#include "base/log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "base/param.h"

int coll_log_level = COLL_LEVEL_WARN;
int coll_log_subsys = COLL_LOG_INIT | COLL_LOG_NET | COLL_LOG_COLL | COLL_LOG_TUNE | COLL_LOG_CUDA;

static pthread_once_t log_once = PTHREAD_ONCE_INIT;
static int log_rank = -1;
static char log_host[64];

static void log_setup(void) {
  const char *level = coll_param_str(COLL_PARAM_DEBUG);
  if (strcasecmp(level, "INFO") == 0 || strcasecmp(level, "TRACE") == 0)
    coll_log_level = COLL_LEVEL_INFO;
  else if (strcasecmp(level, "NONE") == 0 || strcasecmp(level, "OFF") == 0)
    coll_log_level = COLL_LEVEL_NONE;
  else
    coll_log_level = COLL_LEVEL_WARN;

  const char *subsys = coll_param_str(COLL_PARAM_DEBUG_SUBSYS);
  if (subsys[0] && strcasecmp(subsys, "ALL") != 0) {
    static const struct { const char *name; int bit; } names[] = {
        {"INIT", COLL_LOG_INIT}, {"NET", COLL_LOG_NET}, {"COLL", COLL_LOG_COLL},
        {"TUNE", COLL_LOG_TUNE}, {"CUDA", COLL_LOG_CUDA}};
    int mask = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", subsys);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
      for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcasecmp(tok, names[i].name) == 0) mask |= names[i].bit;
    coll_log_subsys = mask;
  }
  if (gethostname(log_host, sizeof log_host) != 0) snprintf(log_host, sizeof log_host, "?");
  log_host[sizeof log_host - 1] = 0;
}

void coll_log_init(void) { pthread_once(&log_once, log_setup); }

void coll_log_set_rank(int rank) { log_rank = rank; }

void coll_log(int level, int subsys, const char *file, int line, const char *fmt, ...) {
  (void)subsys;
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  const char *base = strrchr(file, '/');
  base = base ? base + 1 : file;
  /* One fprintf per line so lines from threads do not interleave. */
  fprintf(stderr, "%s:%d [%d] COLLECTIVES %s %s:%d %s\n", log_host, (int)getpid(), log_rank,
          level == COLL_LEVEL_WARN ? "WARN" : "INFO", base, line, msg);
}
