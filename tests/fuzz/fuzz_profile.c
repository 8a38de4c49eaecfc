/* libFuzzer target for the JSON the program reads back from users' files:
 * the parser on any bytes, and what parses as a saved layer profile
 * (`balance --profile-in`) checked against the MLP fixture's graph, then
 * balanced over two stages. Any bytes end in a result or an error with a
 * message, never a crash, a hang or a sanitizer report. The fixture is
 * read from models/ under the working folder (the repository's root, as
 * .ci/run runs it); without it only the parser is fuzzed. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "onnx/load.h"
#include "partitioner/balance.h"
#include "partitioner/profile.h"
#include "util/json_parse.h"

static struct gp_graph graph;
static int have_graph = -1;
static char path[64];

static void remove_file(void) { unlink(path); }

static void setup(void)
{
    struct gp_error err = {0};
    have_graph = gp_onnx_load("models/mlp_op17.onnx", 4, &graph, &err) == GP_OK;
    snprintf(path, sizeof path, "/tmp/fuzz_profile.%d.json", (int)getpid());
    atexit(remove_file);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (have_graph < 0) setup();
    struct gp_json_doc doc;
    struct gp_error err = {0};
    if (gp_json_parse((const char *)data, size, &doc, &err) != GP_OK) {
        if (err.msg[0] == '\0') __builtin_trap(); /* every failure must explain itself */
        return 0;
    }
    gp_json_doc_free(&doc);
    if (!have_graph) return 0;
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    size_t wrote = fwrite(data, 1, size, f);
    if (fclose(f) != 0 || wrote != size) return 0;
    struct gp_profile prof;
    if (gp_profile_load(path, &graph, &prof, &err) != GP_OK) {
        if (err.msg[0] == '\0') __builtin_trap();
        return 0;
    }
    struct gp_balance_config bc = {.by = (size & 1) ? GP_BALANCE_MEMORY : GP_BALANCE_TIME, .n_stages = 2,
                                   .batch = 8, .n_micro = 2, .optim_state_floats = 1, .inputs_ahead = true};
    struct gp_balance_report rep;
    if (gp_balance(&prof, &bc, &rep, &err) != GP_OK && err.msg[0] == '\0') __builtin_trap();
    gp_profile_free(&prof);
    return 0;
}
