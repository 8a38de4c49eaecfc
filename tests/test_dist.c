/* Several processes, the parts that need no second process: the launcher's
 * environment read for each launcher (and refused when garbled), Slurm's
 * tasks-per-node lists, and the agreement on settings (records compared as
 * the ranks would exchange them). tests/test_mpi.sh runs the rest under
 * mpirun. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/agree.h"
#include "dist/comm.h"
#include "dist/launch.h"
#include "dist/rank_gpus.h"

/* A fake environment: NULL-terminated name, value pairs. */
static const char *fake_get(void *user, const char *name)
{
    const char *const *env = user;
    for (int k = 0; env[k]; k += 2)
        if (!strcmp(env[k], name)) return env[k + 1];
    return NULL;
}

static struct gp_launch detect_ok(const char *const *env)
{
    struct gp_launch l;
    struct gp_error err = {0};
    gp_status st = gp_launch_detect(fake_get, (void *)env, &l, &err);
    if (st != GP_OK) fail_msg("detect failed: %s", err.msg);
    return l;
}

static void detect_fails(const char *const *env, const char *needle)
{
    struct gp_launch l;
    struct gp_error err = {0};
    assert_int_equal(gp_launch_detect(fake_get, (void *)env, &l, &err), GP_ERR_INVALID);
    if (!strstr(err.msg, needle)) fail_msg("'%s' does not name '%s'", err.msg, needle);
}

static void test_no_launcher(void **state)
{
    (void)state;
    const char *env[] = {"HOME", "/root", "SLURM_NTASKS", "8", "SLURM_PROCID", "0", NULL};
    /* A Slurm batch script (SLURM_PROCID without srun's step variables) is
     * not a launched rank. */
    struct gp_launch l = detect_ok(env);
    assert_int_equal(l.launcher, GP_LAUNCH_NONE);
    assert_int_equal(l.rank, 0);
    assert_int_equal(l.size, 1);
    assert_int_equal(l.local_rank, 0);
    assert_int_equal(l.local_size, 1);
    const char *empty[] = {NULL};
    assert_int_equal(detect_ok(empty).launcher, GP_LAUNCH_NONE);
}

static void test_openmpi(void **state)
{
    (void)state;
    const char *env[] = {"OMPI_COMM_WORLD_RANK", "5", "OMPI_COMM_WORLD_SIZE", "8",
                         "OMPI_COMM_WORLD_LOCAL_RANK", "1", "OMPI_COMM_WORLD_LOCAL_SIZE", "4",
                         /* mpirun inside a Slurm allocation: Open MPI's describe this process */
                         "SLURM_PROCID", "0", "SLURM_STEP_NUM_TASKS", "1", "SLURM_LOCALID", "0",
                         "SLURM_NODEID", "0", "SLURM_STEP_TASKS_PER_NODE", "1", NULL};
    struct gp_launch l = detect_ok(env);
    assert_int_equal(l.launcher, GP_LAUNCH_OPENMPI);
    assert_int_equal(l.rank, 5);
    assert_int_equal(l.size, 8);
    assert_int_equal(l.local_rank, 1);
    assert_int_equal(l.local_size, 4);
    assert_string_equal(gp_launcher_name(l.launcher), "Open MPI");
}

static void test_pmi(void **state)
{
    (void)state;
    const char *env[] = {"PMI_RANK", "2", "PMI_SIZE", "3", "MPI_LOCALRANKID", "0", "MPI_LOCALNRANKS", "1", NULL};
    struct gp_launch l = detect_ok(env);
    assert_int_equal(l.launcher, GP_LAUNCH_PMI);
    assert_int_equal(l.rank, 2);
    assert_int_equal(l.size, 3);
    assert_int_equal(l.local_rank, 0);
    assert_int_equal(l.local_size, 1);
}

static void test_slurm(void **state)
{
    (void)state;
    /* 7 tasks on 3 nodes, 3 + 3 + 1: rank 6 is alone on node 2. */
    const char *env[] = {"SLURM_PROCID", "6", "SLURM_STEP_NUM_TASKS", "7", "SLURM_LOCALID", "0",
                         "SLURM_NODEID", "2", "SLURM_STEP_TASKS_PER_NODE", "3(x2),1", "SLURM_NTASKS", "16", NULL};
    struct gp_launch l = detect_ok(env);
    assert_int_equal(l.launcher, GP_LAUNCH_SLURM);
    assert_int_equal(l.rank, 6);
    assert_int_equal(l.size, 7); /* the step's, not the allocation's */
    assert_int_equal(l.local_rank, 0);
    assert_int_equal(l.local_size, 1);
    const char *env2[] = {"SLURM_PROCID", "4", "SLURM_STEP_NUM_TASKS", "7", "SLURM_LOCALID", "1",
                          "SLURM_NODEID", "1", "SLURM_STEP_TASKS_PER_NODE", "3(x2),1", NULL};
    l = detect_ok(env2);
    assert_int_equal(l.local_rank, 1);
    assert_int_equal(l.local_size, 3);
}

static void test_slurm_list(void **state)
{
    (void)state;
    assert_int_equal(gp_launch_slurm_tasks_on_node("4", 0), 4);
    assert_int_equal(gp_launch_slurm_tasks_on_node("4", 1), -1);
    assert_int_equal(gp_launch_slurm_tasks_on_node("2(x3),1", 0), 2);
    assert_int_equal(gp_launch_slurm_tasks_on_node("2(x3),1", 2), 2);
    assert_int_equal(gp_launch_slurm_tasks_on_node("2(x3),1", 3), 1);
    assert_int_equal(gp_launch_slurm_tasks_on_node("2(x3),1", 4), -1);
    assert_int_equal(gp_launch_slurm_tasks_on_node("1,5(x2)", 2), 5);
    static const char *const bad[] = {"", "x", "2(3)", "2(x)", "2(x0)", "2(x3", "2,,1", "2;1", "-1", "2(x3)1"};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++)
        if (gp_launch_slurm_tasks_on_node(bad[k], 0) != -1 && gp_launch_slurm_tasks_on_node(bad[k], 1) != -1)
            fail_msg("'%s' was taken", bad[k]);
    assert_int_equal(gp_launch_slurm_tasks_on_node(NULL, 0), -1);
    assert_int_equal(gp_launch_slurm_tasks_on_node("4", -1), -1);
}

static void test_garbled(void **state)
{
    (void)state;
    const char *no_size[] = {"OMPI_COMM_WORLD_RANK", "1", NULL};
    detect_fails(no_size, "OMPI_COMM_WORLD_SIZE is not set");
    const char *rank_past[] = {"PMI_RANK", "4", "PMI_SIZE", "4", "MPI_LOCALRANKID", "0", "MPI_LOCALNRANKS", "1", NULL};
    detect_fails(rank_past, "PMI_RANK is '4'");
    const char *not_number[] = {"OMPI_COMM_WORLD_RANK", "1", "OMPI_COMM_WORLD_SIZE", "2x",
                                "OMPI_COMM_WORLD_LOCAL_RANK", "0", "OMPI_COMM_WORLD_LOCAL_SIZE", "1", NULL};
    detect_fails(not_number, "OMPI_COMM_WORLD_SIZE is '2x'");
    const char *local_past[] = {"OMPI_COMM_WORLD_RANK", "1", "OMPI_COMM_WORLD_SIZE", "2",
                                "OMPI_COMM_WORLD_LOCAL_RANK", "2", "OMPI_COMM_WORLD_LOCAL_SIZE", "2", NULL};
    detect_fails(local_past, "OMPI_COMM_WORLD_LOCAL_RANK is '2'");
    const char *no_local[] = {"PMI_RANK", "0", "PMI_SIZE", "2", NULL};
    detect_fails(no_local, "MPI_LOCALNRANKS is not set");
    const char *slurm_list[] = {"SLURM_PROCID", "0", "SLURM_STEP_NUM_TASKS", "2", "SLURM_LOCALID", "0",
                                "SLURM_NODEID", "3", "SLURM_STEP_TASKS_PER_NODE", "2", NULL};
    detect_fails(slurm_list, "SLURM_STEP_TASKS_PER_NODE '2' has no count");
    const char *negative[] = {"SLURM_PROCID", "-1", "SLURM_STEP_NUM_TASKS", "2", NULL};
    detect_fails(negative, "SLURM_PROCID is '-1'");
    const char *no_procid[] = {"SLURM_STEP_NUM_TASKS", "2", NULL};
    detect_fails(no_procid, "SLURM_PROCID is not set");
}

/* ---- agreement ---- */

static void settings(struct gp_agree_record *r, const char *lr)
{
    gp_agree_init(r);
    gp_agree_add(r, "the model", "m.onnx (100 bytes, xxh64 0123456789abcdef)");
    gp_agree_add(r, "--batch", "%d", 32);
    gp_agree_add(r, "--lr", "%s", lr);
}

static gp_status compare(const struct gp_agree_record *records, int n, char *msg)
{
    struct gp_error err = {0};
    gp_status st = gp_agree_compare(records, n, &err);
    strcpy(msg, err.msg);
    return st;
}

static void test_agree_same(void **state)
{
    (void)state;
    struct gp_agree_record *r = calloc(4, sizeof *r);
    for (int k = 0; k < 4; k++) settings(&r[k], "0.01");
    char msg[GP_ERROR_MSG_MAX];
    assert_int_equal(compare(r, 4, msg), GP_OK);
    /* Equal settings are equal bytes: what the digest exchange relies on. */
    assert_memory_equal(&r[0], &r[3], sizeof r[0]);
    free(r);
}

static void test_agree_differs(void **state)
{
    (void)state;
    struct gp_agree_record *r = calloc(4, sizeof *r);
    for (int k = 0; k < 4; k++) settings(&r[k], k == 2 ? "0.02" : "0.01");
    char msg[GP_ERROR_MSG_MAX];
    assert_int_equal(compare(r, 4, msg), GP_ERR_INVALID);
    if (!strstr(msg, "rank 2's --lr 0.02 differs from rank 0's 0.01")) fail_msg("%s", msg);
    assert_null(strstr(msg, "rank 1"));
    assert_null(strstr(msg, "rank 3"));
    /* A setting one rank lacks, one it has alone, a replaced value. */
    settings(&r[2], "0.01");
    gp_agree_add(&r[1], "--momentum", "0.9");
    gp_agree_add(&r[0], "--nesterov", "on");
    gp_agree_add(&r[2], "--nesterov", "on");
    gp_agree_add(&r[3], "--nesterov", "on");
    gp_agree_add(&r[3], "--batch", "%d", 64);
    assert_int_equal(compare(r, 4, msg), GP_ERR_INVALID);
    if (!strstr(msg, "rank 1 has --momentum 0.9 where rank 0 has none")) fail_msg("%s", msg);
    if (!strstr(msg, "rank 1 has no --nesterov where rank 0 has on")) fail_msg("%s", msg);
    if (!strstr(msg, "rank 3's --batch 64 differs from rank 0's 32")) fail_msg("%s", msg);
    assert_null(strstr(msg, "rank 2"));
    free(r);
}

static void test_agree_long_values(void **state)
{
    (void)state;
    /* Values longer than a record shows still compare whole. */
    char a[600], b[600];
    memset(a, 'x', sizeof a - 1);
    a[sizeof a - 1] = '\0';
    memcpy(b, a, sizeof a);
    b[sizeof b - 2] = 'y';
    struct gp_agree_record r[2];
    gp_agree_init(&r[0]);
    gp_agree_init(&r[1]);
    gp_agree_add(&r[0], "--data", "%s", a);
    gp_agree_add(&r[1], "--data", "%s", b);
    char msg[GP_ERROR_MSG_MAX];
    assert_int_equal(compare(r, 2, msg), GP_ERR_INVALID);
    if (!strstr(msg, "rank 1's --data")) fail_msg("%s", msg);
}

static void test_agree_detail(void **state)
{
    (void)state;
    /* The same bytes from another path agree; other bytes are named with
     * both paths. */
    struct gp_agree_record r[3];
    for (int k = 0; k < 3; k++) gp_agree_init(&r[k]);
    gp_agree_add_detail(&r[0], "model", "/a/m.onnx", "100 bytes, xxh64 %s", "00000000000000aa");
    gp_agree_add_detail(&r[1], "model", "/b/m.onnx", "100 bytes, xxh64 %s", "00000000000000aa");
    gp_agree_add_detail(&r[2], "model", "/a/m.onnx", "100 bytes, xxh64 %s", "00000000000000bb");
    char msg[GP_ERROR_MSG_MAX];
    assert_int_equal(compare(r, 2, msg), GP_OK);
    assert_int_equal(compare(r, 3, msg), GP_ERR_INVALID);
    if (!strstr(msg, "rank 2's model /a/m.onnx (100 bytes, xxh64 00000000000000bb) differs from rank 0's /a/m.onnx "
                     "(100 bytes, xxh64 00000000000000aa)"))
        fail_msg("%s", msg);
    assert_null(strstr(msg, "rank 1"));
}

static void test_agree_errors_and_many(void **state)
{
    (void)state;
    int n = 12;
    struct gp_agree_record *r = calloc((size_t)n, sizeof *r);
    for (int k = 0; k < n; k++) settings(&r[k], k ? "0.5" : "0.01");
    gp_agree_fail(&r[5], "cannot read --data 'x.npy'");
    gp_agree_fail(&r[5], "a later reason");
    char msg[GP_ERROR_MSG_MAX];
    assert_int_equal(compare(r, n, msg), GP_ERR_INVALID);
    if (!strstr(msg, "not every rank can run: rank 5: cannot read --data 'x.npy'")) fail_msg("%s", msg);
    assert_null(strstr(msg, "a later reason"));
    /* 10 ranks differ besides: the first few are named, the rest counted. */
    if (!strstr(msg, "(and 5 more)")) fail_msg("%s", msg);
    free(r);
}

static void test_agree_full(void **state)
{
    (void)state;
    struct gp_agree_record r[2];
    gp_agree_init(&r[0]);
    gp_agree_init(&r[1]);
    char label[32];
    for (int k = 0; k < GP_AGREE_MAX_ITEMS + 3; k++) {
        snprintf(label, sizeof label, "--opt%d", k);
        gp_agree_add(&r[0], label, "1");
        if (k < GP_AGREE_MAX_ITEMS + 1) gp_agree_add(&r[1], label, "1");
    }
    assert_int_equal(r[0].n, GP_AGREE_MAX_ITEMS);
    assert_int_equal(r[0].dropped, 3);
    char msg[GP_ERROR_MSG_MAX];
    assert_int_equal(compare(r, 2, msg), GP_ERR_INVALID);
    if (!strstr(msg, "settings past the")) fail_msg("%s", msg);
}

/* Ranks computing on one GPU of one host are found, by host and UUID (the
 * number each rank's CUDA gives it may differ), the first pair named. */
static void test_rank_gpus(void **state)
{
    (void)state;
    struct gp_rank_gpu r[4] = {{.host = "a", .uuid = {1}, .index = 0},
                               {.host = "a", .uuid = {2}, .index = 1},
                               {.host = "b", .uuid = {1}, .index = 0},
                               {.host = "b", .uuid = {2}, .index = 1}};
    int a = -1, b = -1;
    /* The same UUID on two hosts is two GPUs (hosts are told apart). */
    assert_false(gp_rank_gpus_shared(r, 4, &a, &b));
    assert_false(gp_rank_gpus_shared(r, 1, &a, &b));
    /* Rank 3 shown host b's first GPU as its only one (cuda:0 to it). */
    r[3].uuid[0] = 1;
    r[3].index = 0;
    assert_true(gp_rank_gpus_shared(r, 4, &a, &b));
    assert_int_equal(a, 2);
    assert_int_equal(b, 3);
    char msg[512];
    gp_rank_gpus_message(r, a, b, msg, sizeof msg);
    assert_non_null(strstr(msg, "ranks 2 and 3 would both compute on GPU 01000000000000000000000000000000 of host b"));
    assert_non_null(strstr(msg, "CUDA_VISIBLE_DEVICES"));
    /* The first pair by the later rank: 1 and 2 before 0 and 3. */
    struct gp_rank_gpu q[4] = {{.host = "h", .uuid = {7}}, {.host = "h", .uuid = {8}}, {.host = "h", .uuid = {8}},
                               {.host = "h", .uuid = {7}}};
    assert_true(gp_rank_gpus_shared(q, 4, &a, &b));
    assert_int_equal(a, 1);
    assert_int_equal(b, 2);
}

static void test_comm_without_launch(void **state)
{
    (void)state;
    /* Built without MPI, the communicator says so rather than pretending. */
    if (gp_comm_available()) skip();
    struct gp_comm *c = (struct gp_comm *)1;
    struct gp_error err = {0};
    struct gp_launch l = {.launcher = GP_LAUNCH_OPENMPI, .rank = 0, .size = 2, .local_rank = 0, .local_size = 2};
    assert_int_equal(gp_comm_init(&l, 10, &c, &err), GP_ERR_UNSUPPORTED);
    assert_null(c);
    assert_non_null(strstr(err.msg, "built without MPI"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_no_launcher),
        cmocka_unit_test(test_openmpi),
        cmocka_unit_test(test_pmi),
        cmocka_unit_test(test_slurm),
        cmocka_unit_test(test_slurm_list),
        cmocka_unit_test(test_garbled),
        cmocka_unit_test(test_agree_same),
        cmocka_unit_test(test_agree_differs),
        cmocka_unit_test(test_agree_long_values),
        cmocka_unit_test(test_agree_detail),
        cmocka_unit_test(test_agree_errors_and_many),
        cmocka_unit_test(test_agree_full),
        cmocka_unit_test(test_rank_gpus),
        cmocka_unit_test(test_comm_without_launch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
