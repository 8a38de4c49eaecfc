#include "cli/cli.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int gp_cli_fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("gpipe-onnx: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return GP_EXIT_FAIL;
}

int gp_cli_usage(const char *command, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "gpipe-onnx %s: ", command);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n(see 'gpipe-onnx %s --help')\n", command);
    va_end(ap);
    return GP_EXIT_USAGE;
}

bool gp_cli_parse_int(const char *command, const char *option, const char *text, int64_t min,
                      int64_t max, int64_t *out)
{
    char *end = NULL;
    errno = 0;
    long long v = text ? strtoll(text, &end, 10) : 0;
    if (!text || errno || end == text || *end || v < min || v > max) {
        gp_cli_usage(command, "%s needs an integer from %lld to %lld (got '%s')", option,
                     (long long)min, (long long)max, text ? text : "");
        return false;
    }
    *out = v;
    return true;
}

bool gp_cli_parse_size(const char *text, int64_t *out)
{
    if (!text || !*text) return false;
    char *end = NULL;
    errno = 0;
    double v = strtod(text, &end);
    if (errno || end == text || !(v > 0)) return false;
    static const char *const units[] = {"", "K", "M", "G", "T"};
    int u = -1;
    for (int k = 0; k < 5 && u < 0; k++) {
        size_t len = strlen(units[k]);
        if (strncmp(end, units[k], len)) continue;
        const char *rest = end + len;
        /* "", "B" after a bare number; "", "B", "iB" after a unit letter. */
        if (!*rest || !strcmp(rest, "B") || (k > 0 && !strcmp(rest, "iB"))) u = k;
    }
    if (u < 0) return false;
    for (int k = 0; k < u; k++) v *= 1024.0;
    if (!(v >= 1.0 && v < 9.0e18)) return false;
    *out = (int64_t)v;
    return true;
}

const char *gp_cli_bytes(int64_t bytes, char *buf, int size)
{
    static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024.0 && u < 4) {
        v /= 1024.0;
        u++;
    }
    if (u == 0) snprintf(buf, (size_t)size, "%lld B", (long long)bytes);
    else snprintf(buf, (size_t)size, "%.1f %s", v, units[u]);
    return buf;
}

const char *gp_cli_count(int64_t n, char *buf, int size)
{
    char digits[32];
    int len = snprintf(digits, sizeof digits, "%lld", (long long)(n < 0 ? -n : n));
    int o = 0;
    if (n < 0 && o < size - 1) buf[o++] = '-';
    for (int i = 0; i < len && o < size - 1; i++) {
        if (i && (len - i) % 3 == 0 && o < size - 1) buf[o++] = ',';
        buf[o++] = digits[i];
    }
    buf[o] = '\0';
    return buf;
}

int gp_cli_gpu_count(void)
{
    int count = gpo_gpus(NULL, 0, NULL, 0);
    return count > 0 ? count : 0;
}

bool gp_cli_parse_devices(const char *command, const char *list, int *n_out, struct gpo_device *d)
{
    char why[512];
    int n = gpo_devices_parse(list, d, GPO_MAX_STAGES, why, sizeof why);
    if (n >= 0) {
        *n_out = n;
        return true;
    }
    gp_cli_usage(command, "--devices: %s", why);
    return false;
}

void gp_cli_measure_progress(struct gp_cli_measure *m, int problems, double seconds, int done)
{
    const char *what = "cuDNN's convolution algorithms";
    if (done) {
        fprintf(stderr, "%smeasured %s: %d problem%s in %.1f s%s%s%s\n", m->tty ? "\r" : "", what, problems,
                problems == 1 ? "" : "s", seconds, m->hint ? " (" : "", m->hint ? m->hint : "", m->hint ? ")" : "");
    } else if (m->tty) {
        fprintf(stderr, "\rmeasuring %s: %d problem%s, %.0f s ", what, problems, problems == 1 ? "" : "s", seconds);
    } else if (seconds >= m->said + 15) {
        fprintf(stderr, "measuring %s: %d problems, %.0f s\n", what, problems, seconds);
        m->said = seconds;
    }
}
