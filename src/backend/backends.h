/* The backends this build has, by name, so that code above the backend
 * layer (trainer, partitioner, command line) never names one directly. */
#ifndef GP_BACKEND_BACKENDS_H
#define GP_BACKEND_BACKENDS_H

#include <stdbool.h>

#include "backend/device.h"

/* "cpu" or "cuda": the backend's device ops, or NULL when this build has
 * none by that name (built without CUDA). */
const struct gp_device_ops *gp_backend_find(const char *name);

/* The kernel choices the backends measured in this process (device.h's
 * choices_export), as one text that begins with the backend's name
 * (malloc'd; NULL when none), and back, before any are measured: a
 * resumed run computes with the saving run's. *note (may be empty) says
 * what could not be taken back. */
char *gp_backend_choices_export(void);
gp_status gp_backend_choices_import(const char *text, char *note, size_t note_size, struct gp_error *err);

/* Called after each kernel choice measured in this process (one cuDNN
 * convolution problem's algorithms, seconds each on ResNet-50): the
 * seconds it took, on the thread that measured it (a stage's, a planner's),
 * one call at a time. Process-wide; fn NULL: none. A run that reads every
 * choice from a file or a state measures nothing. */
typedef void (*gp_measure_fn)(void *user, double seconds);
void gp_backend_on_measure(gp_measure_fn fn, void *user);

/* A watch over the host's waits for a device stream (stream_synchronize):
 * while the stream has work left, fn is asked every fraction of a
 * millisecond with the seconds waited so far; an error from it ends the
 * wait with that error as the stream's (fn having aborted whatever the
 * stream waits on, so its work ends). Across processes a GPU stream holds
 * NCCL transfers that a dead or hung peer never completes, which a plain
 * wait would wait for forever. Process-wide, set before the streams run
 * and cleared (NULL) after; only the CUDA backend's waits are watched (a
 * CPU device's transfers have their own deadlines). */
typedef gp_status (*gp_wait_fn)(void *user, double waited_s, struct gp_error *err);
void gp_backend_on_wait(gp_wait_fn fn, void *user);

/* Whether devices opened from now on reach their peers directly (CUDA
 * peer access, for copies between GPUs of one process; on by default).
 * Off in a process of a job across processes, which uses one GPU:
 * enabling it would make a context, and take memory, on every other GPU
 * of the host, which other processes compute on. */
void gp_backend_peer_access(bool on);

/* The choices measured during some work, reported as they go: between
 * gp_measure_begin and gp_measure_end, report(user, problems, seconds,
 * false) after each (the counts so far), then once at the end with done
 * true where any was measured. report NULL: nothing. */
struct gp_measure_count {
    void (*report)(void *user, int problems, double seconds, bool done);
    void *user;
    int problems;
    double seconds;
};
void gp_measure_begin(struct gp_measure_count *m);
void gp_measure_end(struct gp_measure_count *m);

/* A device list as the command line and the library take it ("cpu[:N]",
 * "cuda[:N]" or a bare GPU index "N", comma-separated; at most `max`):
 * per entry whether it is a GPU and its index. The message names the bad
 * entry. */
gp_status gp_device_list_parse(const char *list, int max, int *n, bool *cuda, int *index, struct gp_error *err);

#endif
