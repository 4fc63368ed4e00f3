// JobConfig -> MemoryPlanInput, with the trainer's checks of the mesh and the precision (train/trainer.cpp,
// trainer_dist.cpp) minus the GPU probe: a plan is made before one reaches the GPU.
#include "train/plan_input.h"

#include <fmt/format.h>

namespace mt::train {

namespace {

nn::Precision plan_precision(const JobConfig& cfg) {
    const std::string& precision = cfg.run.precision;
    if (cfg.run.device == "cpu") {
        if (precision != "auto" && precision != "f32")
            core::fail_hint(
                core::ExitCode::usage,
                "set run.precision = \"f32\" (or \"auto\") for CPU runs, or plan with --device cuda",
                "run.precision = \"{}\" needs a GPU; this plan is for the CPU, whose ops compute in f32 [{}]",
                precision,
                cfg.source);
        return nn::Precision::cpu(core::DType::f32);
    }
    if (precision == "f32") return nn::Precision::cuda_f32();
    return nn::Precision::cuda_mixed(precision == "fp16" ? core::DType::f16 : core::DType::bf16);
}

}  // namespace

parallel::MemoryPlanInput plan_memory_input(const JobConfig& cfg, int64_t world) {
    const ParallelConfig& p = cfg.parallel;
    if (world <= 0) world = p.tp * p.cp * p.ep * p.pp * std::max<int64_t>(p.dp, 1);
    const parallel::MeshShape mesh =
        parallel::mesh_resolve({.tp = p.tp, .cp = p.cp, .ep = p.ep, .dp = p.dp, .pp = p.pp},
                               world,
                               {.moe = cfg.model.moe_enabled, .num_experts = cfg.model.moe.num_experts},
                               cfg.source);
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
            .precision = plan_precision(cfg),
            .batch = cfg.train.batch_size,
            .seq = cfg.train.seq_len,
            .mesh = mesh,
            .zero_stage = p.zero_stage,
            .bucket_mb = p.bucket_mb,
            .offload = cfg.optim.offload == "cpu",
            .state_dtype = cfg.optim.state_dtype == "bf16" ? core::DType::bf16 : core::DType::f32,
            .deterministic = cfg.run.deterministic,
            .source = cfg.source};
}

}  // namespace mt::train
