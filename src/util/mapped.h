/* The files this process has mapped (the model, its external data), kept in
 * a table that a SIGBUS handler may read. A mapped file that another
 * process truncates while it is in use turns the next read of a lost page
 * into SIGBUS, which no size check made beforehand can rule out; with this
 * table the command line's handler names the file instead of crashing
 * without a word. */
#ifndef GP_UTIL_MAPPED_H
#define GP_UTIL_MAPPED_H

#include <stddef.h>

/* Records [addr, addr + len) as a view of `path` (copied). When the table is
 * full the range is not recorded: the handler then reports a mapped file
 * without its name. */
void gp_mapped_register(const void *addr, size_t len, const char *path);
void gp_mapped_unregister(const void *addr);

/* The file whose mapping holds `addr`, or NULL. Async-signal-safe: lock-free
 * reads of the table; a range being removed at that moment may be missed. */
const char *gp_mapped_find(const void *addr);

#endif
