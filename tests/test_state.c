/* Saved training states (train --save-state, --resume): a run killed with
 * SIGKILL at a step chosen at random and resumed ends with the weights of an
 * uninterrupted run, bit for bit (the saved ONNX files are compared byte for
 * byte), for the digits CNN (BatchNorm, Dropout, AdamW), the GPT fixture
 * (embeddings, dropout, SGD momentum, clipping), two micro-batches on two CPU
 * stages and bf16; what may change on resume changes nothing; corrupt,
 * cut-short, foreign and mismatched states are refused with what is wrong,
 * and resuming from the folder takes the newest whole state.
 *
 * The command line runs as a child process (its path is argv[1]). Nothing
 * depends on timing: the kill lands wherever it lands, and the assertion is
 * exact equality. GP_KILL_SEED fixes the random choices to repeat a run.
 *
 * The runs train on CPU devices; with GP_STATE_DEVICE=cuda:0 (as the GPU
 * suite runs it) the kill and resume tests run again on that GPU, two stages
 * sharing it, and the refusals (which do not depend on the device) are left
 * to the CPU run. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fixtures.h"
#include "train/state.h"
#include "util/xxh64.h"

static const char *cli;
static char tmp[512];
/* The device of one-stage runs and the two devices of two-stage runs. */
static const char *one_device = "cpu:0";
static char two_devices[128] = "cpu:0,cpu:1";
/* On a GPU: the --algorithms file every run shares, so that separate runs
 * (the uninterrupted one, the killed one) convolve with the same cuDNN
 * algorithms, as a resumed one does with its state's. */
static char algorithms[600];
static unsigned rng_state;

static unsigned next_random(void)
{
    rng_state = rng_state * 1103515245u + 12345u;
    return rng_state >> 8;
}

/* ---- running the command line ---- */

#define MAX_ARGS 64

struct args {
    const char *v[MAX_ARGS];
    int n;
};

static void add(struct args *a, const char *s)
{
    assert_true(a->n < MAX_ARGS - 1);
    a->v[a->n++] = s;
    a->v[a->n] = NULL;
}

static void add_list(struct args *a, const char *const *list)
{
    for (; *list; list++) add(a, *list);
}

/* Adds the options `extra` and `more` (either may be NULL) and, unless they
 * name devices themselves, --devices one_device. */
static void add_extras(struct args *a, const char *const *extra, const char *const *more)
{
    bool devices = false;
    for (const char *const *e = extra; e && *e; e++) devices |= !strcmp(*e, "--devices");
    for (const char *const *e = more; e && *e; e++) devices |= !strcmp(*e, "--devices");
    if (extra) add_list(a, extra);
    if (more) add_list(a, more);
    if (!devices) {
        add(a, "--devices");
        add(a, one_device);
    }
    if (algorithms[0]) {
        add(a, "--algorithms");
        add(a, algorithms);
    }
}

/* In a sanitizer build, LeakSanitizer's stop-the-world tracer can crash
 * in the leak check at a process's exit ("Tracer caught signal 11", then
 * "LeakSanitizer has encountered a fatal error", google/sanitizers#1353),
 * after the run itself ended: the checker failing, not the run, whose own
 * exit status is then lost (the process aborts). The crashes seen were the
 * dynamic TLS guess that the tests' intercept_tls_get_addr=0 now avoids
 * (tests/meson.build); this stays for any other cause. A report of
 * anything else is a real failure. */
static bool leak_tracer_crashed(int rc, const char *text)
{
    if (rc != 128 + SIGABRT) return false; /* sanitizers abort: abort_on_error=1 */
    if (!text || !strstr(text, "Tracer caught signal") || !strstr(text, "LeakSanitizer has encountered a fatal error"))
        return false;
    const char *real[] = {"ERROR: AddressSanitizer", "ERROR: LeakSanitizer: detected memory leaks", "runtime error:"};
    for (size_t i = 0; i < sizeof real / sizeof *real; i++)
        if (strstr(text, real[i])) return false;
    return true;
}

/* Runs `gpipe-onnx train ...` once; its stderr into *err_text (malloc'd,
 * may be NULL), stdout discarded. Returns the exit status, or 128 + signal. */
static int run_train_once(const struct args *a, char **err_text)
{
    char err_path[600];
    snprintf(err_path, sizeof err_path, "%s/stderr.txt", tmp);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int e = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0666), o = open("/dev/null", O_WRONLY);
        dup2(e, 2);
        dup2(o, 1);
        const char *argv[MAX_ARGS + 2] = {cli, "train"};
        for (int i = 0; i < a->n; i++) argv[i + 2] = a->v[i];
        execv(cli, (char *const *)argv);
        _exit(127);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    size_t n = 0;
    char *text = (char *)read_whole(err_path, &n);
    if (text) {
        char *z = realloc(text, n + 1);
        assert_non_null(z);
        text = z;
        text[n] = '\0';
    }
    if (err_text) *err_text = text;
    else free(text);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* Runs it, once more where only the leak checker crashed at its exit (its
 * status unknown). Every run here may be repeated: a resumed one that
 * finished resumes again from its last state, with nothing left to do,
 * and saves the same model and state. */
static int run_train(const struct args *a, char **err_text)
{
    char *text = NULL;
    int rc = run_train_once(a, &text);
    if (leak_tracer_crashed(rc, text)) {
        print_message("the leak checker's tracer crashed at the run's exit (not the run): running it again\n");
        free(text);
        text = NULL;
        rc = run_train_once(a, &text);
    }
    if (err_text) *err_text = text;
    else free(text);
    return rc;
}

/* Runs it and expects success. */
static void train_ok(const struct args *a)
{
    char *err = NULL;
    int rc = run_train(a, &err);
    if (rc != 0) print_error("train exited %d:\n%s\n", rc, err ? err : "");
    free(err);
    assert_int_equal(rc, 0);
}

/* Runs it and expects exit 1 with `needle` in its message. */
static void train_refused(const struct args *a, const char *needle)
{
    char *err = NULL;
    int rc = run_train(a, &err);
    if (rc != 1 || !err || !strstr(err, needle))
        print_error("expected exit 1 saying '%s', got %d:\n%s\n", needle, rc, err ? err : "");
    assert_int_equal(rc, 1);
    assert_non_null(strstr(err, needle));
    free(err);
}

/* The two saved models are the same bytes (the same weights, statistics). */
static void assert_same_file(const char *a, const char *b)
{
    size_t na = 0, nb = 0;
    unsigned char *x = read_whole(a, &na), *y = read_whole(b, &nb);
    assert_non_null(x);
    assert_non_null(y);
    size_t at = 0;
    while (at < na && at < nb && x[at] == y[at]) at++;
    if (na != nb || at != na) print_error("%s and %s differ at byte %zu (sizes %zu, %zu)\n", a, b, at, na, nb);
    assert_true(na == nb && at == na);
    free(x);
    free(y);
}

static char *path_in(const char *name)
{
    char *p = malloc(700);
    snprintf(p, 700, "%s/%s", tmp, name);
    return p;
}

/* ---- folders ---- */

static int count_prefix(const char *dir, const char *prefix)
{
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (!strncmp(e->d_name, prefix, strlen(prefix))) n++;
    closedir(d);
    return n;
}

/* Copies a folder of state folders (two levels, plain files). */
static void copy_tree(const char *from, const char *to)
{
    mkdir(to, 0777);
    DIR *d = opendir(from);
    assert_non_null(d);
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char a[1200], b[1200];
        snprintf(a, sizeof a, "%s/%s", from, e->d_name);
        snprintf(b, sizeof b, "%s/%s", to, e->d_name);
        struct stat st;
        assert_int_equal(lstat(a, &st), 0);
        if (S_ISDIR(st.st_mode)) {
            copy_tree(a, b);
        } else {
            size_t n = 0;
            unsigned char *data = read_whole(a, &n);
            assert_non_null(data);
            assert_int_equal(write_whole(b, data, n), 0);
            free(data);
        }
    }
    closedir(d);
}

/* ---- the runs ---- */

static char digits_x[600], digits_y[600], val_x[600], val_y[600], digits[600], gpt[600], mlp[600];

/* The digits CNN (BatchNorm, Dropout) with AdamW, 22 steps per epoch, so
 * 40 steps cross an epoch (a new shuffle). */
static void digits_args(struct args *a, const char *steps)
{
    const char *const list[] = {digits, "--data", digits_x, "--labels", digits_y, "--batch", "64", "--steps",
                                steps, "--optimizer", "adamw", "--lr", "0.002", NULL};
    add_list(a, list);
}

/* The GPT fixture on synthetic tokens: embeddings, dropout, SGD with
 * momentum and gradient clipping, 8 steps per epoch. */
static void gpt_args(struct args *a, const char *steps)
{
    const char *const list[] = {gpt, "--synthetic", "64", "--batch", "8", "--steps", steps, "--optimizer", "sgd",
                                "--momentum", "0.9", "--lr", "0.05", "--clip-norm", "0.5", NULL};
    add_list(a, list);
}

typedef void (*run_args_fn)(struct args *a, const char *steps);

/* Trains `steps` steps uninterrupted into `out` (with extra options). */
static void uninterrupted(run_args_fn base, const char *const *extra, const char *steps, const char *out)
{
    struct args a = {0};
    base(&a, steps);
    add_extras(&a, extra, NULL);
    add(&a, "--save");
    add(&a, out);
    train_ok(&a);
}

/* Starts the run with --save-state into dir and kills it with SIGKILL
 * once it has saved the state of step `kill_after` (a random extra delay
 * of up to `delay_us` later, to land anywhere in the following steps or
 * state writes). Returns true when the kill ended it (false: it finished
 * first). */
static bool run_and_kill(const struct args *a, int64_t kill_after, unsigned delay_us)
{
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int o = open("/dev/null", O_WRONLY);
        dup2(fds[1], 2);
        dup2(o, 1);
        close(fds[0]);
        close(fds[1]);
        const char *argv[MAX_ARGS + 2] = {cli, "train"};
        for (int i = 0; i < a->n; i++) argv[i + 2] = a->v[i];
        execv(cli, (char *const *)argv);
        _exit(127);
    }
    close(fds[1]);
    FILE *f = fdopen(fds[0], "r");
    assert_non_null(f);
    char line[4096];
    bool sent = false;
    while (!sent && fgets(line, sizeof line, f)) {
        const char *at = strstr(line, "saved state ");
        long long step = -1;
        const char *paren = at ? strstr(at, "(step ") : NULL;
        if (paren && sscanf(paren, "(step %lld)", &step) == 1 && step >= kill_after) {
            if (delay_us) usleep(delay_us);
            kill(pid, SIGKILL);
            sent = true;
        }
    }
    fclose(f);
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
}

/* Every state-N folder left in dir opens whole (a kill never leaves a half one). */
static void assert_states_whole(const char *dir)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, "state-", 6) != 0) continue;
        char p[1200];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        struct gp_state *s = NULL;
        struct gp_error err = {0};
        if (gp_state_open(p, &s, &err) != GP_OK) print_error("%s\n", err.msg);
        assert_non_null(s);
        gp_state_close(s);
    }
    closedir(d);
}

/* Kill at a random step, resume, compare with the uninterrupted run: of
 * 40 steps, 16 under the sanitizers (GP_SANITIZED=1: each run is ~10x
 * slower there, and these runs test state files, not long training). */
static void kill_and_resume(const char *name, run_args_fn base, const char *const *extra, int every, int keep)
{
    const char *san = getenv("GP_SANITIZED");
    int steps = san && !strcmp(san, "1") ? 16 : 40;
    char steps_s[16], last_state[32];
    snprintf(steps_s, sizeof steps_s, "%d", steps);
    snprintf(last_state, sizeof last_state, "state-%08d", steps);
    char *reference = path_in("reference.onnx"), *resumed = path_in("resumed.onnx"), *dir = path_in("states");
    remove_tree(dir);
    uninterrupted(base, extra, steps_s, reference);
    char every_s[16], keep_s[16];
    snprintf(every_s, sizeof every_s, "%d", every);
    snprintf(keep_s, sizeof keep_s, "%d", keep);
    bool killed = false;
    for (int attempt = 0; attempt < 4 && !killed; attempt++) {
        remove_tree(dir);
        int64_t kill_after =
            every * (1 + (int64_t)(next_random() % (unsigned)((steps - 1) / every - (attempt > 1))));
        unsigned delay = attempt ? 0 : next_random() % 20000;
        print_message("%s: kill after the state of step %lld, %u us later\n", name, (long long)kill_after, delay);
        struct args a = {0};
        base(&a, steps_s);
        add_extras(&a, extra, NULL);
        const char *const list[] = {"--save-state", dir, "--save-every", every_s, "--keep", keep_s, NULL};
        add_list(&a, list);
        killed = run_and_kill(&a, kill_after, delay);
        if (!killed) print_message("%s: the run ended before the kill; again\n", name);
    }
    assert_true(killed);
    assert_states_whole(dir);
    assert_true(count_prefix(dir, "state-") >= 1);

    struct args a = {0};
    base(&a, steps_s);
    add_extras(&a, extra, NULL);
    const char *const list[] = {"--resume", dir, "--save-state", dir, "--save-every", every_s, "--keep", keep_s,
                                "--save", resumed, NULL};
    add_list(&a, list);
    char *err = NULL;
    int rc = run_train(&a, &err);
    if (rc != 0) print_error("resume exited %d:\n%s\n", rc, err ? err : "");
    assert_int_equal(rc, 0);
    assert_non_null(strstr(err, "resumed from "));
    free(err);
    assert_same_file(reference, resumed);
    /* The resumed run's saves cleared what the killed one left half-written,
     * and kept the newest `keep`, the last one at the end. */
    assert_int_equal(count_prefix(dir, ".state-"), 0);
    assert_int_equal(count_prefix(dir, "state-"), keep);
    assert_int_equal(count_prefix(dir, last_state), 1);
    remove_tree(dir);
    free(reference);
    free(resumed);
    free(dir);
}

static void test_kill_digits(void **state)
{
    (void)state;
    kill_and_resume("digits", digits_args, NULL, 1, 3);
}

static void test_kill_gpt(void **state)
{
    (void)state;
    kill_and_resume("gpt", gpt_args, NULL, 3, 2);
}

static void test_kill_two_stages(void **state)
{
    (void)state;
    const char *const extra[] = {"--chunks", "2", "--devices", two_devices, NULL};
    kill_and_resume("digits on 2 stages", digits_args, extra, 2, 2);
}

static void test_kill_bf16(void **state)
{
    (void)state;
    const char *const extra[] = {"--precision", "bf16", "--chunks", "2", NULL};
    kill_and_resume("digits in bf16", digits_args, extra, 1, 2);
}

/* Resumes from state `from` of a run saved every 10 steps, with `resume_extra`
 * options, into out. */
static void resume_from(run_args_fn base, const char *const *extra, const char *dir, const char *from,
                        const char *steps, const char *const *resume_extra, const char *out)
{
    char state[800];
    snprintf(state, sizeof state, "%s/%s", dir, from);
    struct args a = {0};
    base(&a, steps);
    add_extras(&a, extra, resume_extra);
    const char *const list[] = {"--resume", state, "--save", out, NULL};
    add_list(&a, list);
    train_ok(&a);
}

static void save_states(run_args_fn base, const char *const *extra, const char *dir, const char *steps,
                        const char *every)
{
    remove_tree(dir);
    struct args a = {0};
    base(&a, steps);
    add_extras(&a, extra, NULL);
    const char *const list[] = {"--save-state", dir, "--save-every", every, "--keep", "10", NULL};
    add_list(&a, list);
    train_ok(&a);
}

/* Resuming from a mid-run state (no kill), and what may change on resume:
 * stages, devices, checkpoint mode, pipeline schedule; a longer run
 * continues too. */
static void test_resume_mid_run(void **state)
{
    (void)state;
    char *reference = path_in("reference.onnx"), *out = path_in("out.onnx"), *dir = path_in("states"),
         *longer = path_in("longer.onnx");
    const char *const extra[] = {"--chunks", "2", NULL};
    uninterrupted(digits_args, extra, "40", reference);
    save_states(digits_args, extra, dir, "40", "10");
    assert_int_equal(count_prefix(dir, "state-"), 4);
    resume_from(digits_args, extra, dir, "state-00000020", "40", NULL, out);
    assert_same_file(reference, out);
    /* Two stages on two CPU devices, every micro-batch recomputed, 1F1B. */
    const char *const stages[] = {"--devices", two_devices, "--checkpoint", "always", "--pipeline-schedule", "1f1b",
                                  NULL};
    resume_from(digits_args, extra, dir, "state-00000010", "40", stages, out);
    assert_same_file(reference, out);
    /* Training longer from the last state: the same as 60 steps at once. */
    uninterrupted(digits_args, extra, "60", longer);
    resume_from(digits_args, extra, dir, "state-00000040", "60", NULL, out);
    assert_same_file(longer, out);
    /* The final state resumed with nothing left to do: the same weights. */
    resume_from(digits_args, extra, dir, "state-00000040", "40", NULL, out);
    assert_same_file(reference, out);
    remove_tree(dir);
    free(reference);
    free(out);
    free(dir);
    free(longer);
}

/* ---- what is refused ---- */

static char *good_states; /* digits, every 10 steps: states 10, 20, 30, 40 */

static void prepare_states(void)
{
    if (good_states) return;
    good_states = path_in("good");
    save_states(digits_args, NULL, good_states, "40", "10");
    assert_int_equal(count_prefix(good_states, "state-"), 4);
}

/* A fresh copy of the good states, and the path of one file in it. */
static char *copy_of_states(const char *name, const char *state, const char *file, char *file_path, size_t size)
{
    prepare_states();
    char *dir = path_in(name);
    remove_tree(dir);
    copy_tree(good_states, dir);
    if (file_path) snprintf(file_path, size, "%s/%s/%s", dir, state, file);
    return dir;
}

static void flip_byte(const char *path, long at)
{
    size_t n = 0;
    unsigned char *data = read_whole(path, &n);
    assert_non_null(data);
    if (at < 0) at = (long)n / 2;
    data[at] ^= 0x5a;
    assert_int_equal(write_whole(path, data, n), 0);
    free(data);
}

static void resume_refused(const char *dir_or_state, const char *const *options, const char *needle)
{
    char *out = path_in("refused.onnx");
    struct args a = {0};
    digits_args(&a, "40");
    add_extras(&a, options, NULL);
    const char *const list[] = {"--resume", dir_or_state, "--save", out, NULL};
    add_list(&a, list);
    train_refused(&a, needle);
    struct stat st;
    assert_int_not_equal(stat(out, &st), 0); /* nothing saved */
    free(out);
}

static void test_corrupt_states(void **state)
{
    (void)state;
    char file[1200], one[1200];
    /* A flipped byte in a tensor: that state is refused naming the tensor. */
    char *dir = copy_of_states("flipped", "state-00000040", "tensors.bin", file, sizeof file);
    flip_byte(file, -1);
    snprintf(one, sizeof one, "%s/state-00000040", dir);
    resume_refused(one, NULL, "does not match its digest: the state is corrupt");
    remove_tree(dir);
    free(dir);
    /* A blob cut short. */
    dir = copy_of_states("truncated", "state-00000040", "tensors.bin", file, sizeof file);
    assert_int_equal(truncate(file, 4096), 0);
    snprintf(one, sizeof one, "%s/state-00000040", dir);
    resume_refused(one, NULL, "tensors.bin has 4096 bytes, the manifest says");
    resume_refused(one, NULL, "(cut short)");
    remove_tree(dir);
    free(dir);
    /* A flipped byte in the manifest. */
    dir = copy_of_states("manifest", "state-00000040", "manifest.json", file, sizeof file);
    flip_byte(file, 200);
    snprintf(one, sizeof one, "%s/state-00000040", dir);
    resume_refused(one, NULL, "the manifest is corrupt");
    remove_tree(dir);
    free(dir);
    /* A manifest cut short. */
    dir = copy_of_states("manifest_cut", "state-00000040", "manifest.json", file, sizeof file);
    assert_int_equal(truncate(file, 3000), 0);
    snprintf(one, sizeof one, "%s/state-00000040", dir);
    resume_refused(one, NULL, "the manifest has no digest");
    remove_tree(dir);
    free(dir);
    /* No manifest. */
    dir = copy_of_states("no_manifest", "state-00000040", "manifest.json", file, sizeof file);
    unlink(file);
    snprintf(one, sizeof one, "%s/state-00000040", dir);
    resume_refused(one, NULL, "no manifest.json (not a complete state)");
    remove_tree(dir);
    free(dir);
    /* No state at all. */
    char *empty = path_in("empty");
    mkdir(empty, 0777);
    resume_refused(empty, NULL, "it holds no saved state");
    char *missing = path_in("missing");
    resume_refused(missing, NULL, "cannot resume from");
    free(empty);
    free(missing);
}

/* The newest state is corrupt, then the two newest: resuming from the
 * folder takes the newest whole one, naming each one skipped, and still
 * ends as the uninterrupted run. */
static void test_newest_corrupt_uses_previous(void **state)
{
    (void)state;
    char file[1200];
    char *reference = path_in("reference.onnx"), *out = path_in("out.onnx");
    uninterrupted(digits_args, NULL, "40", reference);
    char *dir = copy_of_states("newest_bad", "state-00000040", "tensors.bin", file, sizeof file);
    flip_byte(file, -1);
    snprintf(file, sizeof file, "%s/state-00000030/tensors.bin", dir);
    assert_int_equal(truncate(file, 100), 0);
    struct args a = {0};
    digits_args(&a, "40");
    add_extras(&a, NULL, NULL);
    const char *const list[] = {"--resume", dir, "--save", out, NULL};
    add_list(&a, list);
    char *err = NULL;
    int rc = run_train(&a, &err);
    if (rc != 0) print_error("exited %d:\n%s\n", rc, err ? err : "");
    assert_int_equal(rc, 0);
    assert_non_null(strstr(err, "skipped a state that is not whole"));
    assert_non_null(strstr(err, "state-00000040: tensor '"));
    assert_non_null(strstr(err, "state-00000030/tensors.bin has 100 bytes"));
    assert_non_null(strstr(err, "resumed from "));
    assert_non_null(strstr(err, "state-00000020 (step 20 of 40)"));
    free(err);
    assert_same_file(reference, out);
    /* Every state bad: refused, with each one's reason. */
    for (int s = 10; s <= 20; s += 10) {
        snprintf(file, sizeof file, "%s/state-%08d/manifest.json", dir, s);
        unlink(file);
    }
    resume_refused(dir, NULL, "is whole");
    remove_tree(dir);
    free(dir);
    free(reference);
    free(out);
}

/* A state of another model, a manifest of another model's state, and runs
 * whose settings differ: refused with what differs. */
static void test_mismatched(void **state)
{
    (void)state;
    prepare_states();
    char one[1200];
    snprintf(one, sizeof one, "%s/state-00000040", good_states);
    /* Another model's state. */
    char *other = path_in("other_model");
    remove_tree(other);
    struct args a = {0};
    const char *const list[] = {mlp, "--synthetic", "128", "--batch", "64", "--steps", "2", "--save-state", other,
                                NULL};
    add_list(&a, list);
    train_ok(&a);
    char other_state[1200];
    snprintf(other_state, sizeof other_state, "%s/state-00000002", other);
    resume_refused(other_state, NULL, "is of another model: it has no parameter 'conv1.weight'");
    /* Its manifest in a digits state: the blob does not match it. */
    char file[1400], from[1400];
    char *dir = copy_of_states("foreign_manifest", "state-00000040", "manifest.json", file, sizeof file);
    snprintf(from, sizeof from, "%s/manifest.json", other_state);
    size_t n = 0;
    unsigned char *m = read_whole(from, &n);
    assert_non_null(m);
    assert_int_equal(write_whole(file, m, n), 0);
    free(m);
    snprintf(file, sizeof file, "%s/state-00000040", dir);
    resume_refused(file, NULL, "bytes, the manifest says");
    remove_tree(dir);
    free(dir);
    remove_tree(other);
    free(other);

    /* Settings that change the arithmetic. */
    const char *const batch[] = {"--batch", "32", NULL};
    resume_refused(one, batch, "the state was saved with --batch 64, this run has --batch 32");
    const char *const seed[] = {"--seed", "7", NULL};
    resume_refused(one, seed, "the state was saved with --seed 0, this run has --seed 7");
    const char *const chunks[] = {"--chunks", "2", NULL};
    resume_refused(one, chunks, "the state was saved with --chunks 1, this run has --chunks 2");
    const char *const bf16[] = {"--precision", "bf16", NULL};
    resume_refused(one, bf16, "the state was saved with --precision fp32, this run has --precision bf16");
    const char *const lr[] = {"--lr", "0.01", "--weight-decay", "0", NULL};
    resume_refused(one, lr, "--lr 0.002, this run has --lr 0.01; the state was saved with --weight-decay 0.01, "
                            "this run has --weight-decay 0");
    const char *const sgd[] = {"--optimizer", "sgd", NULL};
    resume_refused(one, sgd, "the state was saved with --optimizer adamw, this run has --optimizer sgd");
    const char *const noshuffle[] = {"--no-shuffle", NULL};
    resume_refused(one, noshuffle, "the state was saved with shuffling on, this run has shuffling off");
    /* Other data of the same shape (the validation set). */
    const char *const data[] = {"--data", val_x, "--labels", val_y, "--batch", "64", NULL};
    struct args d = {0};
    const char *const base[] = {digits, "--steps", "40", "--optimizer", "adamw", "--lr", "0.002", NULL};
    add_list(&d, base);
    add_list(&d, data);
    const char *const tail[] = {"--resume", one, NULL};
    add_list(&d, tail);
    train_refused(&d, "the state was saved with --data ");
    /* Past the run's end. */
    const char *const shorter[] = {"--steps", "30", NULL};
    resume_refused(one, shorter, "it is at step 40, past this run's 30 steps");

    /* The cosine schedule's length is part of its shape. */
    char *cos = path_in("cosine");
    const char *const cosine[] = {"--schedule", "cosine", "--warmup-steps", "2", NULL};
    save_states(digits_args, cosine, cos, "20", "10");
    struct args c = {0};
    digits_args(&c, "30");
    add_list(&c, cosine);
    add(&c, "--resume");
    add(&c, cos);
    train_refused(&c, "the state was saved with a cosine schedule over 20 steps, this run has a cosine schedule "
                      "over 30 steps");
    remove_tree(cos);
    free(cos);
}

/* Usage errors of the options. */
static void test_options(void **state)
{
    (void)state;
    char *dir = path_in("opts");
    const char *const bad[][3] = {{"--save-every", "ten", NULL}, {"--save-every", "5x", NULL}, {"--keep", "0", NULL}};
    for (int k = 0; k < 3; k++) {
        struct args a = {0};
        digits_args(&a, "2");
        add(&a, "--save-state");
        add(&a, dir);
        add_list(&a, bad[k]);
        assert_int_equal(run_train(&a, NULL), 2);
    }
    struct args a = {0};
    digits_args(&a, "2");
    add(&a, "--save-every");
    add(&a, "5");
    char *err = NULL;
    assert_int_equal(run_train(&a, &err), 2);
    assert_non_null(strstr(err, "--save-every and --keep need --save-state DIR"));
    free(err);
    /* A time period: the only state is the last one (the run is shorter). */
    remove_tree(dir);
    struct args t = {0};
    digits_args(&t, "3");
    const char *const list[] = {"--save-state", dir, "--save-every", "1h", NULL};
    add_list(&t, list);
    train_ok(&t);
    assert_int_equal(count_prefix(dir, "state-"), 1);
    assert_int_equal(count_prefix(dir, "state-00000003"), 1);
    /* A state folder that cannot be made: refused before training. */
    char *blocked = path_in("blocked");
    assert_int_equal(write_whole(blocked, "x", 1), 0);
    struct args b = {0};
    digits_args(&b, "3");
    add(&b, "--save-state");
    char sub[800];
    snprintf(sub, sizeof sub, "%s/states", blocked);
    add(&b, sub);
    train_refused(&b, "is not a folder");
    remove_tree(dir);
    free(dir);
    free(blocked);
}

/* ---- the format ---- */

static void test_xxh64(void **state)
{
    (void)state;
    /* The reference implementation's digests (xxhsum -H1). */
    assert_true(gp_xxh64("", 0, 0) == 0xef46db3751d8e999ull);
    assert_true(gp_xxh64("a", 1, 0) == 0xd24ec4f1a98c6e5bull);
    assert_true(gp_xxh64("abc", 3, 0) == 0x44bc2cf5ad770999ull);
    const char *s = "Nobody inspects the spammish repetition";
    assert_true(gp_xxh64(s, strlen(s), 0) == 0xfbcea83c8a378bf1ull);
    /* In pieces of any size: the same digest. */
    unsigned char data[1000];
    for (int i = 0; i < 1000; i++) data[i] = (unsigned char)(i * 7 + 3);
    uint64_t whole = gp_xxh64(data, sizeof data, 0);
    for (size_t cut = 1; cut < 100; cut += 7) {
        struct gp_xxh64 h;
        gp_xxh64_init(&h, 0);
        for (size_t at = 0; at < sizeof data; at += cut)
            gp_xxh64_update(&h, data + at, sizeof data - at < cut ? sizeof data - at : cut);
        assert_true(gp_xxh64_digest(&h) == whole);
    }
    char hex[17];
    gp_xxh64_hex(0xef46db3751d8e999ull, hex);
    assert_string_equal(hex, "ef46db3751d8e999");
}

/* Random damage (cuts at any offset, flipped bytes, appended bytes) is
 * refused or, where it touched nothing the state holds, harmless: never a
 * crash, never other values accepted. */
static void test_fuzz(void **state)
{
    (void)state;
    prepare_states();
    char good[1200];
    snprintf(good, sizeof good, "%s/state-00000020", good_states);
    struct gp_state *ref = NULL;
    struct gp_error err = {0};
    assert_int_equal(gp_state_open(good, &ref, &err), GP_OK);
    size_t blob_n = 0;
    char path[1300];
    snprintf(path, sizeof path, "%s/tensors.bin", good);
    unsigned char *blob = read_whole(path, &blob_n);
    assert_non_null(blob);
    char *dir = path_in("fuzz");
    int refused = 0, iterations = getenv("GP_SANITIZED") && !strcmp(getenv("GP_SANITIZED"), "1") ? 60 : 300;
    for (int it = 0; it < iterations; it++) {
        remove_tree(dir);
        copy_tree(good, dir);
        const char *file = next_random() % 2 ? "manifest.json" : "tensors.bin";
        snprintf(path, sizeof path, "%s/%s", dir, file);
        size_t n = 0;
        unsigned char *data = read_whole(path, &n);
        assert_non_null(data);
        switch (next_random() % 4) {
        case 0: n = next_random() % n; break;                            /* cut */
        case 1: data[next_random() % n] ^= (unsigned char)(1 + next_random() % 255); break; /* flip */
        case 2:                                                          /* several flips */
            for (int k = 0; k < 5; k++) data[next_random() % n] = (unsigned char)next_random();
            break;
        case 3: {                                                        /* appended bytes */
            unsigned char *m = realloc(data, n + 16);
            assert_non_null(m);
            data = m;
            for (int k = 0; k < 16; k++) data[n + k] = (unsigned char)next_random();
            n += 16;
        }
        }
        assert_int_equal(write_whole(path, data, n), 0);
        free(data);
        struct gp_state *s = NULL;
        struct gp_error e = {0};
        if (gp_state_open(dir, &s, &e) != GP_OK) {
            assert_null(s);
            assert_true(strlen(e.msg) > 0);
            refused++;
            continue;
        }
        /* Accepted: the same tensors, bit for bit. */
        assert_int_equal(s->n_tensors, ref->n_tensors);
        snprintf(path, sizeof path, "%s/tensors.bin", dir);
        size_t m = 0;
        unsigned char *now = read_whole(path, &m);
        assert_non_null(now);
        assert_int_equal(m, blob_n);
        assert_memory_equal(now, blob, m);
        free(now);
        assert_int_equal(s->meta.step, ref->meta.step);
        gp_state_close(s);
    }
    print_message("%d of %d damaged states refused (the others were damaged only outside what is checked: "
                  "the manifest's last bytes)\n", refused, iterations);
    assert_true(refused > iterations * 9 / 10);
    remove_tree(dir);
    free(dir);
    free(blob);
    gp_state_close(ref);
}

/* Whether `gpipe-onnx devices` lists a GPU. */
static bool gpu_visible(void)
{
    char command[1200];
    snprintf(command, sizeof command, "'%s' devices 2>/dev/null", cli);
    FILE *p = popen(command, "r");
    if (!p) return false;
    char line[512];
    bool found = false;
    while (fgets(line, sizeof line, p)) found |= !strncmp(line, "cuda:", 5) && line[5] >= '0' && line[5] <= '9';
    pclose(p);
    return found;
}

static int setup(void **state)
{
    (void)state;
    assert_non_null(temp_dir(tmp, sizeof tmp));
    if (algorithms[0]) snprintf(algorithms, sizeof algorithms, "%s/algorithms.txt", tmp);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    remove_tree(tmp);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s PATH-TO-gpipe-onnx\n", argv[0]);
        return 2;
    }
    cli = argv[1];
    const char *seed = getenv("GP_KILL_SEED");
    rng_state = seed ? (unsigned)strtoul(seed, NULL, 10) : (unsigned)time(NULL) ^ (unsigned)getpid();
    printf("random choices from GP_KILL_SEED=%u\n", rng_state);
    fixture_path("digits_train_x.npy", digits_x, sizeof digits_x);
    fixture_path("digits_train_y.npy", digits_y, sizeof digits_y);
    fixture_path("digits_val_x.npy", val_x, sizeof val_x);
    fixture_path("digits_val_y.npy", val_y, sizeof val_y);
    fixture_path("digits_cnn_op17.onnx", digits, sizeof digits);
    fixture_path("gpt_op17.onnx", gpt, sizeof gpt);
    fixture_path("mlp_op17.onnx", mlp, sizeof mlp);
    const char *device = getenv("GP_STATE_DEVICE");
    if (device && *device) {
        if (!strncmp(device, "cuda", 4) && !gpu_visible()) {
            printf("no GPU visible: skipped\n");
            return 77;
        }
        one_device = device;
        snprintf(two_devices, sizeof two_devices, "%s,%s", device, device);
        printf("training on %s (two stages: %s)\n", one_device, two_devices);
        algorithms[0] = '-'; /* setup names the file in the temporary folder */
        const struct CMUnitTest on_device[] = {
            cmocka_unit_test(test_kill_digits),
            cmocka_unit_test(test_kill_gpt),
            cmocka_unit_test(test_kill_two_stages),
            cmocka_unit_test(test_kill_bf16),
            cmocka_unit_test(test_resume_mid_run),
        };
        return cmocka_run_group_tests(on_device, setup, teardown);
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_xxh64),
        cmocka_unit_test(test_kill_digits),
        cmocka_unit_test(test_kill_gpt),
        cmocka_unit_test(test_kill_two_stages),
        cmocka_unit_test(test_kill_bf16),
        cmocka_unit_test(test_resume_mid_run),
        cmocka_unit_test(test_corrupt_states),
        cmocka_unit_test(test_newest_corrupt_uses_previous),
        cmocka_unit_test(test_mismatched),
        cmocka_unit_test(test_options),
        cmocka_unit_test(test_fuzz),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
