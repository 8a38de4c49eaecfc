/* What the program itself needs of the library beyond the public API
 * (include/gpipe_onnx.h): training as one stage of a pipeline spread over
 * processes (src/dist/, `train --pipeline`), whose ranks first agree on the
 * engine's resolved configuration. Not installed. */
#ifndef GP_API_PRIVATE_H
#define GP_API_PRIVATE_H

#include "gpipe_onnx.h"
#include "train/trainer.h"

/* The engine's configuration for c as gpo_train resolves it: the
 * options, the devices (their defaults applied) and the split (layers per
 * stage; all 0 for an even split or one still to be found by "time" /
 * "memory"). Its strings point into c. */
gpo_status gpo_train_engine_config(gpo_model *m, const struct gpo_train_config *c, struct gp_train_config *out);

/* gpo_train with this process running one stage of one replica (remote,
 * pipeline/pipeline.h): every rank calls it alike; the trained weights are
 * not kept in the context (rank 0 writes save_path). */
gpo_status gpo_train_remote(gpo_model *m, const struct gpo_train_config *c, const struct gp_pipe_remote *remote,
                            const struct gpo_train_callbacks *cb, struct gpo_train_result *out);

#endif
