// The [parallel] checks across keys that do not need the number of processes (the mesh's own checks, against the
// world, are parallel/mesh.h's mesh_resolve): what tensor parallelism must divide; and the mesh the config resolves to.
// Internal to src/train (and the CLI's check of the mesh before run.dir is created).
#pragma once

#include <string>

#include "parallel/mesh.h"
#include "train/config.h"

namespace mt::train {

// With parallel.tp > 1 (exit 2 naming the keys): model.n_heads, model.n_kv_heads and the dense MLP width divisible
// by tp; model.vocab_size too unless parallel.pad_vocab; under sequence parallelism train.batch_size x seq_len (and
// every curriculum stage's) divisible by tp; KDA and MoE layers are not split by tp yet. With parallel.cp > 1: every
// sequence length a multiple of 2 x cp x 64, and what context parallelism does not run yet refused.
void config_parallel_validate(const JobConfig& c, const std::string& src);

// The mesh [parallel] asks for over `world` processes: parallel::mesh_resolve of the config's sizes (exit 2 when they
// do not fit). The trainer, the CLI's check before run.dir is touched, and the memory plan all resolve it here.
parallel::MeshShape config_mesh_shape(const JobConfig& c, int64_t world);

}  // namespace mt::train
