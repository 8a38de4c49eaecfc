/* What the program itself needs of the library beyond the public API
 * (include/gpipe_onnx.h): `train --pipeline`, where the ranks of a job
 * (src/dist/, cli/distributed.c) agree on the engine's configuration,
 * adjust it per rank, and each trains one stage with it. Not installed. */
#ifndef GP_API_PRIVATE_H
#define GP_API_PRIVATE_H

#include "gpipe_onnx.h"
#include "train/trainer.h"

/* The engine's configuration for c as gpo_train resolves it: the
 * options, the devices (their defaults applied) and the split (layers per
 * stage; all 0 for an even split or one still to be found by "time" /
 * "memory"). Its strings point into c. */
gpo_status gpo_train_engine_config(gpo_model *m, const struct gpo_train_config *c, struct gp_train_config *out);

/* Trains with `engine` as given: a configuration from
 * gpo_train_engine_config that the caller went on to adjust (as one stage
 * of a multi-process pipeline: its remote link, its device, its trace file,
 * the state every rank resumes from, the split the ranks agreed on). The
 * data are c's, found and loaded as gpo_train does; nothing else of c is
 * read: no outputs checked, no split searched, no weights kept. */
gpo_status gpo_train_engine(gpo_model *m, const struct gpo_train_config *c, const struct gp_train_config *engine,
                            const struct gpo_train_callbacks *cb, struct gpo_train_result *out);

#endif
