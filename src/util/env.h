/* Developer settings from the environment: the GP_* variables README.md
 * lists (which cuDNN API, which fusions, what to print). */
#ifndef GP_UTIL_ENV_H
#define GP_UTIL_ENV_H

#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Each reads its variable at every call (a test sets one between calls;
 * callers that read it per layer cache it themselves). Unset or empty:
 * the default. A value the setting does not take is reported on stderr,
 * once per variable and value in the process, naming what it takes, and
 * the default used: a misspelt setting would otherwise run the default
 * silently, and a benchmark of it measure the default. */

/* The index in `choices` (NULL-terminated) of `name`'s value, or
 * `fallback` (the default's index, or -1 for "none of them"). */
int gp_env_choice(const char *name, const char *const *choices, int fallback);

/* On ("1", "on", "yes", "true") or off ("0", "off", "no", "false"). */
bool gp_env_flag(const char *name, bool fallback);

/* A whole number from 1 to `max` (`fallback` below 1: none given). */
long gp_env_positive(const char *name, long max, long fallback);

#ifdef __cplusplus
}
#endif

#endif
