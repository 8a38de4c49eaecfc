/* Developer settings from the environment (env.h). */
#include "util/env.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Whether "name=value" was reported before; remembers it if not. A few
 * dozen at most: a process that sets more than the table holds reports
 * the rest each time. */
static bool reported_before(const char *name, const char *value)
{
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static char seen[64][128];
    static int n_seen;
    char key[128];
    snprintf(key, sizeof key, "%s=%s", name, value);
    pthread_mutex_lock(&mu);
    bool before = false;
    for (int i = 0; i < n_seen && !before; i++) before = !strcmp(seen[i], key);
    if (!before && n_seen < 64) snprintf(seen[n_seen++], sizeof seen[0], "%s", key);
    pthread_mutex_unlock(&mu);
    return before;
}

static void report(const char *name, const char *value, const char *takes, const char *used)
{
    if (reported_before(name, value)) return;
    fprintf(stderr, "gpipe-onnx: warning: %s=%s is not %s: %s\n", name, value, takes, used);
}

int gp_env_choice(const char *name, const char *const *choices, int fallback)
{
    const char *v = getenv(name);
    if (!v || !*v) return fallback;
    char takes[512] = "one of";
    size_t len = strlen(takes);
    for (int i = 0; choices[i]; i++) {
        if (!strcmp(v, choices[i])) return i;
        int w = snprintf(takes + len, sizeof takes - len, "%s %s", i ? "," : "", choices[i]);
        if (w > 0 && (size_t)w < sizeof takes - len) len += (size_t)w;
    }
    char used[160];
    if (fallback >= 0)
        snprintf(used, sizeof used, "the default, %s, is used", choices[fallback]);
    else
        snprintf(used, sizeof used, "the default is used");
    report(name, v, takes, used);
    return fallback;
}

bool gp_env_flag(const char *name, bool fallback)
{
    static const char *const words[] = {"0", "1", "off", "on", "no", "yes", "false", "true", NULL};
    const char *v = getenv(name);
    if (!v || !*v) return fallback;
    for (int i = 0; words[i]; i++)
        if (!strcmp(v, words[i])) return i % 2 == 1;
    report(name, v, "1 or 0 (on, off, yes, no, true, false)", fallback ? "on, the default" : "off, the default");
    return fallback;
}

long gp_env_positive(const char *name, long max, long fallback)
{
    const char *v = getenv(name);
    if (!v || !*v) return fallback;
    char *end = NULL;
    errno = 0;
    long k = strtol(v, &end, 10);
    if (v[0] >= '0' && v[0] <= '9' && errno == 0 && !*end && k >= 1 && k <= max) return k;
    char takes[64], used[64];
    snprintf(takes, sizeof takes, "a whole number from 1 to %ld", max);
    if (fallback >= 1)
        snprintf(used, sizeof used, "the default, %ld, is used", fallback);
    else
        snprintf(used, sizeof used, "it is ignored");
    report(name, v, takes, used);
    return fallback;
}
