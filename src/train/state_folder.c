/* The folder of saved training states (the format: train/state.h): a
 * state written into a hidden folder and renamed into place, the states
 * past the newest K removed, and the newest whole one found to resume. */
#include "train/state.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/atomic_file.h"
#include "util/json_writer.h"
#include "util/xxh64.h"

#define FORMAT_NAME GP_STATE_FORMAT
#define MANIFEST GP_STATE_MANIFEST
#define TENSORS GP_STATE_TENSORS

static void copy_str(char *dst, size_t size, const char *src)
{
    snprintf(dst, size, "%s", src ? src : "");
}

/* ---- folders ---- */

/* "state-00000040" -> 40; false for any other name (temporaries start with '.'). */
static bool state_step(const char *name, int64_t *step)
{
    if (strncmp(name, "state-", 6) != 0) return false;
    const char *d = name + 6;
    if (strlen(d) < 8 || strlen(d) > 18) return false;
    int64_t v = 0;
    for (; *d; d++) {
        if (*d < '0' || *d > '9') return false;
        v = v * 10 + (*d - '0');
    }
    *step = v;
    return true;
}

static void fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return;
    (void)fsync(fd); /* best effort: some file systems refuse it */
    close(fd);
}

/* Removes a state folder: renamed to a hidden name first, so that a
 * removal cut short never leaves a partial state under a state- name, then
 * its files (a state holds no sub-folders) and itself. */
static void remove_state(const char *dir, const char *name)
{
    static atomic_uint counter;
    char from[4096], to[4096];
    snprintf(from, sizeof from, "%s/%s", dir, name);
    if (name[0] == '.') {
        snprintf(to, sizeof to, "%s", from);
    } else {
        snprintf(to, sizeof to, "%s/.%s.del-%ld-%u", dir, name, (long)getpid(), atomic_fetch_add(&counter, 1u));
        if (rename(from, to) != 0) return;
    }
    DIR *d = opendir(to);
    if (d) {
        struct dirent *e;
        char p[4352];
        while ((e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            snprintf(p, sizeof p, "%s/%s", to, e->d_name);
            unlink(p);
        }
        closedir(d);
    }
    rmdir(to);
}

static gp_status make_dirs(const char *dir, struct gp_error *err)
{
    char path[4096];
    if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path)
        return gp_error_set(err, GP_ERR_IO, "the state folder name '%.64s...' is too long", dir);
    for (char *p = path + 1; ; p++) {
        if (*p != '/' && *p) continue;
        char c = *p;
        *p = '\0';
        struct stat st;
        if (stat(path, &st) != 0) {
            if (mkdir(path, 0777) != 0 && errno != EEXIST)
                return gp_error_set(err, GP_ERR_IO, "cannot make the state folder '%s': %s", path, strerror(errno));
        } else if (!S_ISDIR(st.st_mode)) {
            return gp_error_set(err, GP_ERR_IO, "cannot keep states in '%s': '%s' is not a folder", dir, path);
        }
        *p = c;
        if (!c) break;
    }
    return GP_OK;
}

/* Hidden temporaries of writers that no longer run (killed mid-write):
 * ".state-N.tmp-PID-K" and ".state-N.del-PID-K". */
static void remove_stale(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return;
    char names[64][256];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 64) {
        const char *tag = strstr(e->d_name, ".tmp-");
        if (!tag) tag = strstr(e->d_name, ".del-");
        if (strncmp(e->d_name, ".state-", 7) != 0 || !tag) continue;
        long pid = strtol(tag + 5, NULL, 10);
        if (pid == (long)getpid()) continue;
        if (pid <= 0 || (kill((pid_t)pid, 0) != 0 && errno == ESRCH)) copy_str(names[n++], sizeof names[0], e->d_name);
    }
    closedir(d);
    for (int i = 0; i < n; i++) remove_state(dir, names[i]);
}

gp_status gp_state_check_dir(const char *dir, struct gp_error *err)
{
    GP_TRY(make_dirs(dir, err));
    char probe[4200];
    snprintf(probe, sizeof probe, "%s/.state-check.tmp-%ld-0", dir, (long)getpid());
    if (mkdir(probe, 0777) != 0)
        return gp_error_set(err, GP_ERR_IO, "cannot write states in '%s': %s", dir, strerror(errno));
    rmdir(probe);
    return GP_OK;
}

/* ---- writing ---- */

struct entry {
    char *name, *role;
    struct gp_shape shape;
    uint64_t offset, bytes, xxh64;
};

struct gp_state_writer {
    char dir[4096], tmp[4200];
    int64_t step;
    struct gp_atomic_file blob;
    char blob_path[4300];
    struct gp_xxh64 whole;
    uint64_t bytes;
    struct entry *entries;
    int n, cap;
};

static bool little_endian(void)
{
    const uint16_t one = 1;
    return *(const unsigned char *)&one == 1;
}

gp_status gp_state_begin(const char *dir, int64_t step, struct gp_state_writer **out, struct gp_error *err)
{
    static atomic_uint counter;
    *out = NULL;
    if (!little_endian())
        return gp_error_set(err, GP_ERR_UNSUPPORTED, "training states are little-endian; this machine is not");
    GP_TRY(make_dirs(dir, err));
    remove_stale(dir);
    struct gp_state_writer *w = calloc(1, sizeof *w);
    if (!w) return gp_error_set(err, GP_ERR_NOMEM, "out of memory");
    copy_str(w->dir, sizeof w->dir, dir);
    w->step = step;
    snprintf(w->tmp, sizeof w->tmp, "%s/.state-%08lld.tmp-%ld-%u", dir, (long long)step, (long)getpid(),
             atomic_fetch_add(&counter, 1u));
    if (mkdir(w->tmp, 0777) != 0) {
        gp_status st = gp_error_set(err, GP_ERR_IO, "cannot write a state in '%s': %s", dir, strerror(errno));
        free(w);
        return st;
    }
    snprintf(w->blob_path, sizeof w->blob_path, "%s/" TENSORS, w->tmp);
    if (gp_atomic_create(&w->blob, w->blob_path, err) != GP_OK) {
        rmdir(w->tmp);
        free(w);
        return err ? err->status : GP_ERR_IO;
    }
    gp_xxh64_init(&w->whole, 0);
    *out = w;
    return GP_OK;
}

gp_status gp_state_add(struct gp_state_writer *w, const char *name, const char *role, const struct gp_shape *shape,
                       const float *data, struct gp_error *err)
{
    if (w->n == w->cap) {
        int cap = w->cap ? 2 * w->cap : 64;
        struct entry *e = realloc(w->entries, sizeof *e * (size_t)cap);
        if (!e) return gp_error_set(err, GP_ERR_NOMEM, "out of memory");
        w->entries = e;
        w->cap = cap;
    }
    size_t bytes = sizeof(float) * (size_t)gp_shape_numel(shape);
    struct entry *e = &w->entries[w->n];
    *e = (struct entry){.name = strdup(name), .role = strdup(role), .shape = *shape, .offset = w->bytes,
                        .bytes = bytes, .xxh64 = gp_xxh64(data, bytes, 0)};
    if (!e->name || !e->role) {
        free(e->name);
        free(e->role);
        return gp_error_set(err, GP_ERR_NOMEM, "out of memory");
    }
    w->n++;
    gp_atomic_write(&w->blob, data, bytes);
    gp_xxh64_update(&w->whole, data, bytes);
    w->bytes += bytes;
    return GP_OK;
}

static void free_writer(struct gp_state_writer *w)
{
    for (int i = 0; i < w->n; i++) {
        free(w->entries[i].name);
        free(w->entries[i].role);
    }
    free(w->entries);
    free(w);
}

void gp_state_abort(struct gp_state_writer *w)
{
    if (!w) return;
    gp_atomic_abort(&w->blob);
    char name[4200];
    const char *slash = strrchr(w->tmp, '/');
    copy_str(name, sizeof name, slash ? slash + 1 : w->tmp);
    remove_state(w->dir, name);
    free_writer(w);
}

static void hex_string(struct gp_json *j, uint64_t digest)
{
    char hex[17];
    gp_xxh64_hex(digest, hex);
    gp_json_string(j, hex);
}

/* The manifest, up to (not including) its digest member. */
static void write_manifest(struct gp_json *j, const struct gp_state_writer *w, const struct gp_state_meta *m)
{
    gp_json_object_begin(j);
    gp_json_key(j, "format");
    gp_json_string(j, FORMAT_NAME);
    gp_json_key(j, "version");
    gp_json_int(j, GP_STATE_VERSION);
    gp_json_key(j, "step");
    gp_json_int(j, w->step);
    gp_json_key(j, "epoch");
    gp_json_int(j, m->epoch);
    gp_json_key(j, "next_sample");
    gp_json_int(j, m->next_sample);
    gp_json_key(j, "steps_per_epoch");
    gp_json_int(j, m->steps_per_epoch);
    gp_json_key(j, "total_steps");
    gp_json_int(j, m->total_steps);
    gp_json_key(j, "optimizer_steps");
    gp_json_int(j, m->optimizer_steps);
    gp_json_key(j, "next_lr");
    gp_json_double(j, m->next_lr);
    gp_json_key(j, "epoch_loss_sum");
    gp_json_double(j, m->epoch_loss_sum);
    gp_json_key(j, "epoch_steps");
    gp_json_int(j, m->epoch_steps);
    gp_json_key(j, "data_order");
    gp_json_object_begin(j);
    gp_json_key(j, "shuffle");
    gp_json_bool(j, m->shuffle);
    gp_json_key(j, "seed");
    char seed[32];
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)m->seed);
    gp_json_string(j, seed);
    gp_json_object_end(j);
    if (m->kernel_choices) {
        gp_json_key(j, "kernel_choices");
        gp_json_string(j, m->kernel_choices);
    }
    gp_json_key(j, "config");
    gp_json_object_begin(j);
    for (int i = 0; i < m->n_settings; i++) {
        const struct gp_state_setting *s = &m->settings[i];
        gp_json_key(j, s->key);
        gp_json_object_begin(j);
        gp_json_key(j, "label");
        gp_json_string(j, s->label);
        gp_json_key(j, "value");
        gp_json_string(j, s->value);
        gp_json_key(j, "detail");
        gp_json_string(j, s->detail);
        gp_json_key(j, "rule");
        gp_json_string(j, gp_state_rule_name(s->rule));
        gp_json_object_end(j);
    }
    gp_json_object_end(j);
    gp_json_key(j, "tensors");
    gp_json_array_begin(j);
    for (int i = 0; i < w->n; i++) {
        const struct entry *e = &w->entries[i];
        gp_json_object_begin(j);
        gp_json_key(j, "name");
        gp_json_string(j, e->name);
        gp_json_key(j, "role");
        gp_json_string(j, e->role);
        gp_json_key(j, "dtype");
        gp_json_string(j, "float32");
        gp_json_key(j, "shape");
        gp_json_array_begin(j);
        for (int d = 0; d < e->shape.rank; d++) gp_json_int(j, e->shape.dims[d]);
        gp_json_array_end(j);
        gp_json_key(j, "offset");
        gp_json_int(j, (int64_t)e->offset);
        gp_json_key(j, "bytes");
        gp_json_int(j, (int64_t)e->bytes);
        gp_json_key(j, "xxh64");
        hex_string(j, e->xxh64);
        gp_json_object_end(j);
    }
    gp_json_array_end(j);
    gp_json_key(j, "tensors_file");
    gp_json_string(j, TENSORS);
    gp_json_key(j, "tensors_bytes");
    gp_json_int(j, (int64_t)w->bytes);
    gp_json_key(j, "tensors_xxh64");
    hex_string(j, gp_xxh64_digest(&w->whole));
}

struct listed {
    int64_t step;
    char name[32];
};

static int by_step_desc(const void *a, const void *b)
{
    int64_t x = ((const struct listed *)a)->step, y = ((const struct listed *)b)->step;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* The state folders in dir, newest first; *n of them (malloc'd list). */
static struct listed *list_states(const char *dir, int *n)
{
    *n = 0;
    DIR *d = opendir(dir);
    if (!d) return NULL;
    int cap = 16;
    struct listed *l = malloc(sizeof *l * (size_t)cap);
    struct dirent *e;
    while (l && (e = readdir(d))) {
        int64_t step;
        if (!state_step(e->d_name, &step)) continue;
        if (*n == cap) {
            struct listed *m = realloc(l, sizeof *l * (size_t)(cap *= 2));
            if (!m) break;
            l = m;
        }
        l[*n].step = step;
        snprintf(l[*n].name, sizeof l[*n].name, "%.30s", e->d_name); /* state_step took at most 24 */
        (*n)++;
    }
    closedir(d);
    if (l) qsort(l, (size_t)*n, sizeof *l, by_step_desc);
    return l;
}

/* After state `step` is in place: states past it go (a resumed run
 * rewrites its future), and all but the newest `keep` up to it. */
static void prune(const char *dir, int64_t step, int keep)
{
    int n = 0;
    struct listed *l = list_states(dir, &n);
    int kept = 0;
    for (int i = 0; i < n; i++) {
        if (l[i].step > step || (l[i].step <= step && ++kept > keep)) remove_state(dir, l[i].name);
    }
    free(l);
}

gp_status gp_state_commit(struct gp_state_writer *w, const struct gp_state_meta *meta, int keep, char *path,
                          size_t path_size, struct gp_error *err)
{
    gp_status st = gp_atomic_commit(&w->blob, err);
    if (st != GP_OK) {
        gp_state_abort(w);
        return st;
    }
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    if (!mem) {
        gp_state_abort(w);
        return gp_error_set(err, GP_ERR_NOMEM, "out of memory");
    }
    struct gp_json j;
    gp_json_init(&j, mem, true);
    write_manifest(&j, w, meta);
    fflush(mem);
    uint64_t digest = gp_xxh64(text, len, 0);
    gp_json_key(&j, GP_STATE_DIGEST_KEY);
    hex_string(&j, digest);
    gp_json_object_end(&j);
    gp_json_finish(&j);
    bool ok = fclose(mem) == 0 && text;
    char manifest[4300];
    snprintf(manifest, sizeof manifest, "%s/" MANIFEST, w->tmp);
    struct gp_atomic_file a;
    if (!ok) st = gp_error_set(err, GP_ERR_NOMEM, "out of memory");
    else if ((st = gp_atomic_create(&a, manifest, err)) == GP_OK) {
        gp_atomic_write(&a, text, len);
        st = gp_atomic_commit(&a, err); /* fsyncs the file and the temporary folder */
    }
    free(text);
    if (st != GP_OK) {
        gp_state_abort(w);
        return st;
    }
    char final[4200], aside[4300];
    snprintf(final, sizeof final, "%s/state-%08lld", w->dir, (long long)w->step);
    aside[0] = '\0';
    struct stat sb;
    if (lstat(final, &sb) == 0) {
        /* The same step saved before (an earlier run): set aside, removed once the new one is in. */
        snprintf(aside, sizeof aside, "%s/.state-%08lld.del-%ld-0", w->dir, (long long)w->step, (long)getpid());
        if (rename(final, aside) != 0) {
            st = gp_error_set(err, GP_ERR_IO, "cannot replace '%s': %s", final, strerror(errno));
            gp_state_abort(w);
            return st;
        }
    }
    if (rename(w->tmp, final) != 0) {
        st = gp_error_set(err, GP_ERR_IO, "cannot write '%s': rename failed: %s", final, strerror(errno));
        if (aside[0]) (void)rename(aside, final);
        gp_state_abort(w);
        return st;
    }
    fsync_dir(w->dir);
    if (aside[0]) remove_state(w->dir, strrchr(aside, '/') + 1);
    prune(w->dir, w->step, keep < 1 ? 1 : keep);
    if (path) copy_str(path, path_size, final);
    free_writer(w);
    return GP_OK;
}
gp_status gp_state_open_latest(const char *path, void (*skipped)(void *user, const char *message), void *user,
                               struct gp_state **out, struct gp_error *err)
{
    *out = NULL;
    struct stat sb;
    if (stat(path, &sb) != 0)
        return gp_error_set(err, GP_ERR_IO, "cannot resume from '%s': %s", path, strerror(errno));
    if (!S_ISDIR(sb.st_mode))
        return gp_error_set(err, GP_ERR_IO, "cannot resume from '%s': not a folder (give the --save-state folder "
                            "or one of its state-NNNNNNNN folders)", path);
    char file[4200];
    snprintf(file, sizeof file, "%s/" MANIFEST, path);
    const char *base = strrchr(path, '/');
    int64_t step;
    if (access(file, F_OK) == 0 || state_step(base ? base + 1 : path, &step)) return gp_state_open(path, out, err);
    int n = 0;
    struct listed *l = list_states(path, &n);
    if (n == 0) {
        free(l);
        return gp_error_set(err, GP_ERR_IO, "cannot resume from '%s': it holds no saved state (no state-NNNNNNNN folder)",
                            path);
    }
    char why[GP_ERROR_MSG_MAX] = "";
    size_t len = 0;
    gp_status st = GP_OK;
    for (int i = 0; i < n; i++) {
        char one[4200];
        snprintf(one, sizeof one, "%s/%s", path, l[i].name);
        struct gp_error e = {0};
        if ((st = gp_state_open(one, out, &e)) == GP_OK) break;
        if (skipped) {
            char msg[GP_ERROR_MSG_MAX + 64];
            snprintf(msg, sizeof msg, "skipped a state that is not whole: %.2000s", e.msg);
            skipped(user, msg);
        }
        if (len < sizeof why) len += (size_t)snprintf(why + len, sizeof why - len, "%s%s", len ? "; " : "", e.msg);
    }
    free(l);
    if (st != GP_OK) return gp_error_set(err, st, "no state in '%s' is whole: %s", path, why);
    return GP_OK;
}

