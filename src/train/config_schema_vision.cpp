// The [vision] and [projector] rows of the schema (train/config_schema.h): the ViT and the projector of image + text
// training (multimodal.md §1-§2, §7; docs/multimodal.md).
#include "train/config_schema_fields.h"

#include "core/error.h"

namespace mt::train {

using namespace schema;

std::vector<Field> config_schema_vision(JobConfig& c) {
    auto& v = c.model.vision;
    return {
        integer("vision.layers",
                &v.layers,
                0,
                1000,
                "ViT blocks (pre-norm LayerNorm, bidirectional attention inside each image with 2-D RoPE, GELU MLP); 0: "
                "no vision encoder (a text-only model)"),
        integer("vision.dim", &v.dim, 4, 1 << 16, "the ViT's width d_v"),
        integer("vision.heads", &v.heads, 1, 1024, "attention heads; vision.dim / vision.heads must be a multiple of 4"),
        integer("vision.mlp", &v.mlp, 1, 1 << 20, "the ViT MLP's hidden width"),
        integer("vision.patch", &v.patch, 1, 1024, "pixels per patch side (14: 588 values per RGB patch)"),
        text("vision.pos",
             &v.pos,
             "patch positions: `rope2d` rotates half of each head by the patch row and half by its column",
             {"rope2d"}),
        number_above("vision.rope_base", &v.rope_base, 0, 1e12, "the 2-D RoPE's base theta"),
        number_above("vision.norm_eps", &v.norm_eps, 0, 1, "the ViT's and the projector's LayerNorm eps"),
        number_above("vision.init_std", &v.init_std, 0, 10, "std of the ViT's and the projector's weight init"),
        integer("vision.image_token",
                &v.image_token,
                -1,
                int64_t{1} << 31,
                "the <img_pad> id: the model replaces the embedding of every such token with the projector's "
                "outputs, image after image (-1: unset; required with vision.layers > 0)"),
        integer("projector.hidden",
                &v.projector_hidden,
                0,
                1 << 20,
                "the projector MLP's hidden width d_p (LayerNorm(4 d_v) -> Linear(4 d_v, d_p) -> GELU -> "
                "Linear(d_p, model.d_model)); 0: 4 x vision.dim"),
    };
}

void config_vision_validate(const JobConfig& c, const std::string& src) {
    const nn::VisionConfig& v = c.model.vision;
    if (!v.enabled()) return;
    auto bad = [&](const std::string& msg) { core::fail(core::ExitCode::usage, "{} [{}]", msg, src); };
    if (v.dim % v.heads != 0 || v.head_dim() % 4 != 0)
        bad(fmt::format("vision.dim = {} over vision.heads = {} must give a head dim that is a multiple of 4 (the 2-D "
                        "RoPE rotates a quarter of it by rows and a quarter by columns)",
                        v.dim,
                        v.heads));
    if (v.image_token < 0 || v.image_token >= c.model.vocab_size)
        bad(fmt::format("vision.image_token = {} must be an id of the vocabulary [0, {}) with vision.layers = {}",
                        v.image_token,
                        c.model.vocab_size,
                        v.layers));
    const auto& p = c.parallel;
    if (p.tp > 1 || p.cp > 1 || p.pp > 1)
        bad(fmt::format("vision.layers = {} with parallel.tp = {}, cp = {}, pp = {}: image batches run with data and "
                        "expert parallelism only yet (docs/multimodal.md)",
                        v.layers,
                        p.tp,
                        p.cp,
                        p.pp));
    if (c.model.segments.enabled() || c.long_ctx.tokens_per_gpu > 0 || !c.long_ctx.stages.empty())
        bad("vision.layers > 0 with sequence segments or a [long] curriculum: image batches run as one pass yet "
            "(docs/multimodal.md)");
}

}  // namespace mt::train
