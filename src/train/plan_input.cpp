// JobConfig -> MemoryPlanInput, with the trainer's checks of the mesh and the precision (train/trainer.cpp,
// trainer_dist.cpp) minus the GPU probe: a plan is made before one reaches the GPU.
#include "train/plan_input.h"

#include <fmt/format.h>

#include <algorithm>

#include "data/shapes_batcher.h"
#include "train/config_parallel.h"

namespace mt::train {

namespace {

// The most LM tokens one image of the job's data makes (its 2 x 2 patch cells): for images read from disk the largest
// area vision.max_pixels allows, for the shapes set its largest canvas (a resolution control's 336 included; none for
// the text-only twin); the most over the mixed sources. 0 without a vision encoder or images.
int64_t image_tokens_most(const JobConfig& cfg) {
    const nn::VisionConfig& v = cfg.model.vision;
    if (!v.enabled()) return 0;
    const int64_t cell = 2 * v.patch;
    auto of = [&](const DataConfig& d) -> int64_t {
        if (d.images_on_disk()) return v.max_pixels / (cell * cell);
        if (d.format != "shapes" || d.shapes.text_only) return 0;
        int64_t side = d.shapes.max_canvas;
        for (const ShapesControl c : d.shapes.controls)
            if (c == ShapesControl::res336) side = std::max<int64_t>(side, 336);
        return (side / cell) * (side / cell);
    };
    int64_t most = of(cfg.data);
    for (const DataSource& s : cfg.data_sources) most = std::max(most, of(s.data));
    return most;
}

// The fewest tokens besides its image that one image's sample brings into its row: <bos>, <img_start>, <img_end> (3)
// for images read from disk; for the shapes set also the shortest text (a one-object caption, or a VQA text); the
// fewest over the mixed sources.
int64_t image_frame_tokens(const JobConfig& cfg) {
    auto of = [&](const DataConfig& d) -> int64_t {
        if (d.format != "shapes") return 3;
        data::ShapesOptions one;
        one.format = d.shapes.format;
        one.max_objects = 1;
        return 2 +
               data::ShapesBatcher::max_sample_tokens(one, {.kind = data::ShapesViewKind::text_only});  // <bos> + text
    };
    int64_t fewest = of(cfg.data);
    for (const DataSource& s : cfg.data_sources) fewest = std::min(fewest, of(s.data));
    return fewest;
}

}  // namespace

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
            .image_tokens = image_tokens_most(cfg),
            .image_frame_tokens = image_frame_tokens(cfg),
            .source = cfg.source};
}

}  // namespace mt::train
