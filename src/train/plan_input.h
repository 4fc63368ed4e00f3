// The memory planner's input from a job config (parallel/plan_memory.h reads no config itself, so that the planner
// stays below train/): the model, one micro-batch, the precision run.device and run.precision select, the mesh the
// [parallel] sizes resolve to, and the [optim] settings that move or shrink the optimizer state.
#pragma once

#include "parallel/plan_memory.h"
#include "train/config.h"

namespace mt::train {

// world: the job's process count (parallel.dp = 0 fills it; 0: the product of the sizes the config names, dp = 0
// counting as 1). run.device = "auto" plans for the GPU: CUDA with run.precision ("auto" = bf16 mixed). Exit 2,
// naming the key, for a mesh that does not resolve, tensor / context / pipeline parallelism (which the trainer does
// not run yet) and a GPU-only precision on the CPU.
parallel::MemoryPlanInput plan_memory_input(const JobConfig& cfg, int64_t world = 0);

}  // namespace mt::train
