// JobConfig -> MemoryPlanInput, with the trainer's checks of the mesh and the precision (train/trainer.cpp,
// trainer_dist.cpp) minus the GPU probe: a plan is made before one reaches the GPU.
#include "train/plan_input.h"

#include <fmt/format.h>

#include "train/config_parallel.h"

namespace mt::train {

parallel::MemoryPlanInput plan_memory_input(const JobConfig& cfg, int64_t world) {
    const ParallelConfig& p = cfg.parallel;
    if (world <= 0) world = p.tp * p.cp * p.ep * p.pp * std::max<int64_t>(p.dp, 1);
    const parallel::MeshShape mesh = config_mesh_shape(cfg, world);
    // Trainer::check_parallel_layout runs data and expert parallelism only; the plan models what the trainer runs.
    for (auto [axis, key] : {std::pair{parallel::MeshAxis::tp, "parallel.tp"},
                             {parallel::MeshAxis::cp, "parallel.cp"},
                             {parallel::MeshAxis::pp, "parallel.pp"}})
        if (mesh[axis] > 1)
            core::fail_hint(core::ExitCode::usage,
                            fmt::format("set {} = 1; data and expert parallelism (parallel.dp, parallel.ep) are what "
                                        "this version runs and plans",
                                        key),
                            "{} = {}: not implemented yet [{}]",
                            key,
                            mesh[axis],
                            cfg.source);
    return {.model = cfg.model,
            .precision = config_precision(cfg, cfg.run.device != "cpu"),
            .batch = cfg.train.batch_size,
            // A curriculum's longest stage is its largest step (stages grow in length at a fixed batch).
            .seq = cfg.long_ctx.stages.empty() ? cfg.train.seq_len : cfg.long_ctx.stages.back().seq_len,
            .mesh = mesh,
            .zero_stage = p.zero_stage,
            .bucket_mb = p.bucket_mb,
            .offload = cfg.optim.offload == "cpu",
            .state_dtype = config_state_dtype(cfg, core::DType::f32),
            .deterministic = cfg.run.deterministic,
            .source = cfg.source};
}

}  // namespace mt::train
