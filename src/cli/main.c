/* gpipe-onnx: train ONNX models with GPipe pipeline parallelism. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"

#ifndef GP_VERSION
#define GP_VERSION "unknown"
#endif

static void usage(FILE *f)
{
    fputs("usage: gpipe-onnx <command> [options]\n"
          "\n"
          "Train ONNX models (for example exported from PyTorch) with GPipe micro-batch\n"
          "pipeline parallelism.\n"
          "\n"
          "commands:\n"
          "  inspect MODEL.onnx   the model summary and its sequential layer list, with the\n"
          "                       shapes of every layer and the bytes crossing each cut\n"
          "  train MODEL.onnx     train on .npy data (or synthetic data) and save the\n"
          "                       trained model as ONNX\n"
          "  balance MODEL.onnx   profile every layer and split the model across devices\n"
          "                       by time or memory, with a report that explains it\n"
          "  predict MODEL.onnx   the model's outputs for the samples of a .npy file\n"
          "  devices              the CPU and GPUs this build can use\n"
          "\n"
          "options:\n"
          "  -h, --help           this help; 'gpipe-onnx COMMAND --help' for a command's\n"
          "  --version            the program's version\n"
          "  --no-fuse-attention  (with any command that loads a model) run attention as the\n"
          "                       model spells it, MatMul, Softmax, MatMul..., instead of\n"
          "                       one fused Attention layer (the same as GP_FUSE_ATTENTION=0)\n",
          f);
}

static void say(const char *s) { (void)!write(STDERR_FILENO, s, strlen(s)); }

/* Models and external data are read through memory maps (onnx/load.c). If
 * another process truncates such a file while it is in use, reading a lost
 * page raises SIGBUS: name the file and end with the usual failure status
 * instead of a bare "Bus error". Only async-signal-safe calls here. */
static void on_sigbus(int sig, siginfo_t *info, void *ctx)
{
    (void)ctx;
    const char *path = info ? gpo_mapped_file(info->si_addr) : NULL;
    if (path) {
        say("gpipe-onnx: error: '");
        say(path);
        say("' shrank while in use (it is read through a memory map): was it truncated or "
            "rewritten in place? Replace a model by writing a new file and renaming it over "
            "the old one.\n");
    } else {
        say("gpipe-onnx: error: bus error outside the mapped model files\n");
        signal(sig, SIG_DFL); /* not ours: the default action, with its core dump */
        raise(sig);
    }
    _exit(GP_EXIT_FAIL);
}

int main(int argc, char **argv)
{
    struct sigaction sa = {.sa_sigaction = on_sigbus, .sa_flags = SA_SIGINFO};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, NULL);
    if (argc < 2) {
        usage(stderr);
        return GP_EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "-h") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "help") == 0) {
        usage(stdout);
        return GP_EXIT_OK;
    }
    if (strcmp(cmd, "--version") == 0) {
        printf("gpipe-onnx %s\n", GP_VERSION);
        return GP_EXIT_OK;
    }
    /* The attention fusion happens where the model loads (graph/
     * fuse_attention.c), under every command: one flag for all of them,
     * handed on as the environment switch the loader reads. */
    int kept = 1;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--no-fuse-attention") == 0) setenv("GP_FUSE_ATTENTION", "0", 1);
        else argv[kept++] = argv[i];
    }
    argc = kept;
    argv[argc] = NULL;
    if (strcmp(cmd, "inspect") == 0) return gp_cmd_inspect(argc - 1, argv + 1);
    if (strcmp(cmd, "devices") == 0) return gp_cmd_devices(argc - 1, argv + 1);
    if (strcmp(cmd, "train") == 0) return gp_cmd_train(argc - 1, argv + 1);
    if (strcmp(cmd, "predict") == 0) return gp_cmd_predict(argc - 1, argv + 1);
    if (strcmp(cmd, "balance") == 0) return gp_cmd_balance(argc - 1, argv + 1);
    fprintf(stderr, "gpipe-onnx: unknown command '%s'\n\n", cmd);
    usage(stderr);
    return GP_EXIT_USAGE;
}
