// The [vision] and [projector] rows of the schema (train/config_schema.h): the ViT and the projector of image + text
// training (multimodal.md §1-§2, §7; docs/multimodal.md).
#include <algorithm>
#include <functional>

#include "core/error.h"
#include "data/image_codec.h"
#include "data/image_text_rows.h"
#include "data/shapes.h"
#include "data/shapes_batcher.h"
#include "data/shapes_vocab.h"
#include "train/config_schema_fields.h"

namespace mt::train {

using namespace schema;

std::vector<Field> config_schema_vision(JobConfig& c) {
    auto& v = c.model.vision;
    return {
        integer("vision.layers",
                &v.layers,
                0,
                1000,
                "ViT blocks (pre-norm LayerNorm, bidirectional attention inside each image, GELU MLP; positions by "
                "vision.pos); 0: "
                "no vision encoder (a text-only model)"),
        integer("vision.dim", &v.dim, 4, 1 << 16, "the ViT's width d_v"),
        integer("vision.heads",
                &v.heads,
                1,
                1024,
                "attention heads; vision.dim / vision.heads must be whole, a multiple of 4 with `rope2d`"),
        integer("vision.mlp", &v.mlp, 1, 1 << 20, "the ViT MLP's hidden width"),
        integer("vision.patch", &v.patch, 1, 1024, "pixels per patch side (14: 588 values per RGB patch)"),
        text("vision.pos",
             &v.pos,
             "patch positions: `rope2d` rotates half of each head by the patch row and half by its column in every "
             "block; `learned` adds a learned [vision.pos_grid, vision.pos_grid, vision.dim] table, bilinearly "
             "resized to each image's patch grid (align_corners = false, as F.interpolate), to the patch embeddings",
             {"rope2d", "learned"}),
        integer("vision.pos_grid",
                &v.pos_grid,
                1,
                4096,
                "with `vision.pos = \"learned\"`: rows and columns of the position table (32 = 448 px / 14, the side "
                "of vision.max_pixels' square in patches); other grids are resized from it"),
        number_above("vision.rope_base", &v.rope_base, 0, 1e12, "the 2-D RoPE's base theta"),
        number_above("vision.norm_eps", &v.norm_eps, 0, 1, "the ViT's and the projector's LayerNorm eps"),
        number_above("vision.init_std", &v.init_std, 0, 10, "std of the ViT's and the projector's weight init"),
        integer("vision.image_token",
                &v.image_token,
                -1,
                int64_t{1} << 31,
                "the <img_pad> id: the model replaces the embedding of every such token with the projector's "
                "outputs, image after image (-1: unset; required with vision.layers > 0, but with `webdataset` and "
                "`image_jsonl` data, where it is the tokenizer's vocab + 2)"),
        integer("vision.min_pixels",
                &v.min_pixels,
                1,
                data::kImageMaxPixels,
                "images read from disk are resized, keeping their aspect ratio, to sides that are multiples of 2 x "
                "vision.patch and an area of at least this many pixels"),
        integer("vision.max_pixels",
                &v.max_pixels,
                1,
                data::kImageMaxPixels,
                "... and at most this many (at least 2 x vision.min_pixels; 448^2: 256 image tokens)"),
        integer("projector.hidden",
                &v.projector_hidden,
                0,
                1 << 20,
                "the projector MLP's hidden width d_p (LayerNorm(4 d_v) -> Linear(4 d_v, d_p) -> GELU -> "
                "Linear(d_p, model.d_model)); 0: 4 x vision.dim"),
        integer("data.shapes.seed",
                &c.data.shapes.seed,
                -1,
                1e18,
                "with `data.format = \"shapes\"`: the generator's "
                "seed (-1: run.seed)"),
        integer("data.shapes.stage",
                &c.data.shapes.stage,
                1,
                4,
                "the debug ladder: 1 one object, color only (blind bound ln 8); 2 + shape; 3 + position; 4 the full "
                "scenes"),
        integer("data.shapes.max_objects", &c.data.shapes.max_objects, 1, 9, "objects per scene at stage 4: 1 to this"),
        list("data.shapes.held_out",
             &c.data.shapes.held_out,
             "\"color shape\" pairs never in train or val (the compositional split holds them)"),
        integer("data.shapes.val_size", &c.data.shapes.val_size, 1, 1e9, "samples of the fixed val split"),
        flag("data.skip_bad_samples",
             &c.data.skip_bad_samples,
             "with `webdataset` and `image_jsonl`: skip a bad sample (a corrupt image, a missing caption, a truncated "
             "shard, a malformed manifest line) with a counted warning; false: stop with exit 3 naming it"),
        integer("data.loader_threads",
                &c.data.loader_threads,
                0,
                256,
                "with `webdataset` and `image_jsonl`: threads the loader reads, decodes, resizes and patchifies a "
                "batch's images on (per loader, per rank; one setting for every source); 0: half the hardware threads, "
                "1 to 8; the batches are the same bytes for any count"),
        text("data.shapes.format",
             &c.data.shapes.format,
             "`caption`: a caption per image; `vqa`: a color question about a unique shape and its answer",
             {"caption", "vqa"}),
        integer("data.shapes.max_canvas",
                &c.data.shapes.max_canvas,
                112,
                336,
                "canvas sides are drawn uniformly from 112, 168, 224, 280, 336 up to this one (a smaller value makes "
                "a faster CPU config; the captions and the blind bound do not change)"),
        flag("data.shapes.text_only",
             &c.data.shapes.text_only,
             "the text-only twin (control 1): train and evaluate on `<bos>` + caption, the image block removed; its "
             "val loss should reach the blind bound and no lower"),
        choice_list("data.shapes.controls",
                    &c.data.shapes.controls,
                    "eval controls run at every eval beside the plain val set, each over train.eval_batches: "
                    "`zeroed` / `shuffled` images (loss should stay at or above the bound), `flipped` scenes with "
                    "their mirrored captions, the scenes at `res112` / `res336`, and `comp_val` (the held-out "
                    "color-shape pairs); each logs loss, bound ratio and exact match (docs/multimodal.md)"),
    };
}

std::vector<Field> config_schema_loss(JobConfig& c) {
    return {
        text("loss.weighting",
             &c.loss.weighting,
             "how the per-source losses of `[[data.sources]]` combine (multimodal.md §5, docs/multimodal.md \"Mixed "
             "sources and loss weighting\"): `token_mean` the mean over every supervised token; `uncertainty` "
             "sum_i exp(-s_i) L_i + s_i / 2 with learned s_i; `gradnorm` sum_i w_i C_i / N with w learned to balance "
             "the sources' gradient norms on one weight; `dwa` sum_i w_i C_i / N with the weights of dynamic weight "
             "averaging",
             {"token_mean", "uncertainty", "gradnorm", "dwa"}),
        number("loss.gradnorm_alpha", &c.loss.gradnorm_alpha, 0, 100, "GradNorm's asymmetry alpha"),
        number_above(
            "loss.gradnorm_lr", &c.loss.gradnorm_lr, 0, 1e6, "the gradient-descent learning rate of GradNorm's w"),
        text("loss.gradnorm_layer",
             &c.loss.gradnorm_layer,
             "the shared weight W whose gradient norms GradNorm balances, by parameter name; empty: the last layer's "
             "shared-expert down projection (`layers.<L-1>.moe.shared.w_down.weight`), else its dense MLP's "
             "(`layers.<L-1>.mlp.w_down.weight`), else its routed experts' (`layers.<L-1>.moe.experts.w_down`)"),
        number("loss.uncertainty_lr",
               &c.loss.uncertainty_lr,
               0,
               10,
               "AdamW learning rate of the uncertainty weighting's s_i (no weight decay); 0: the step's training lr"),
        integer("loss.dwa_window", &c.loss.dwa_window, 1, 1e9, "steps per DWA window (the mean of each window)"),
        number_above("loss.dwa_temperature", &c.loss.dwa_temperature, 0, 1e6, "DWA's temperature tau"),
    };
}

void config_vision_defaults(JobConfig& c) {
    if (c.data.images_on_disk() && c.model.vision.image_token < 0)
        c.model.vision.image_token = data::image_text_ids(*data::tokenizer_open(c.data.tokenizer)).image.img_pad;
}

namespace {

// The image-text data on disk (docs/data.md "Image-text data"): its special ids after the tokenizer's vocabulary,
// and rows long enough for the largest image.
void validate_images_on_disk(const JobConfig& c, const std::function<void(const std::string&)>& bad) {
    const nn::VisionConfig& v = c.model.vision;
    const std::string format = fmt::format("data.format = \"{}\"", c.data.format);
    if (!v.enabled()) bad(format + " needs a vision encoder: set vision.layers > 0");
    const auto tokenizer = data::tokenizer_open(c.data.tokenizer);
    const data::ImageTextIds ids = data::image_text_ids(*tokenizer);
    const int64_t vocab = tokenizer->vocab_size();
    if (c.model.vocab_size < vocab + data::kImageTextSpecialTokens)
        bad(
            fmt::format("model.vocab_size = {} with {}: the tokenizer's {} ids and the 5 image-text specials after "
                        "them (<bos> {}, <img_start> {}, <img_pad> {}, <img_end> {}, <pad> {}) need at least {}",
                        c.model.vocab_size,
                        format,
                        vocab,
                        ids.bos,
                        ids.image.img_start,
                        ids.image.img_pad,
                        ids.image.img_end,
                        ids.image.pad,
                        vocab + data::kImageTextSpecialTokens));
    if (v.image_token != ids.image.img_pad)
        bad(
            fmt::format("vision.image_token = {} with {}: <img_pad> is the tokenizer's vocab + 2 = {} (leave "
                        "vision.image_token unset)",
                        v.image_token,
                        format,
                        ids.image.img_pad));
    if (c.model.document_mask && c.model.eot_token != ids.eot)
        bad(fmt::format("data.eot_token = {} with {}: captions end with the tokenizer's EOT {}",
                        c.model.eot_token,
                        format,
                        ids.eot));
    const int64_t unit = 2 * v.patch;
    if (v.min_pixels < unit * unit || v.max_pixels < 2 * v.min_pixels)
        bad(
            fmt::format("vision.min_pixels = {} and vision.max_pixels = {}: need min_pixels >= (2 x vision.patch)^2 "
                        "= {} and max_pixels >= 2 x min_pixels (so that every aspect ratio has a size in range)",
                        v.min_pixels,
                        v.max_pixels,
                        unit * unit));
    const int64_t largest = v.max_pixels / (unit * unit);
    if (c.train.seq_len < largest + 5)
        bad(
            fmt::format("train.seq_len = {} cannot hold the largest image vision.max_pixels = {} allows ({} image "
                        "tokens) with its 4 frame tokens and a caption token: raise train.seq_len to at least {} or "
                        "lower vision.max_pixels",
                        c.train.seq_len,
                        v.max_pixels,
                        largest,
                        largest + 5));
}

}  // namespace

void config_vision_validate(const JobConfig& c, const std::string& src) {
    const nn::VisionConfig& v = c.model.vision;
    auto bad = [&](const std::string& msg) { core::fail(core::ExitCode::usage, "{} [{}]", msg, src); };
    if (c.data.images_on_disk()) validate_images_on_disk(c, bad);
    if (c.data.format == "shapes") {
        if (!v.enabled()) bad("data.format = \"shapes\" needs a vision encoder: set vision.layers > 0");
        if (v.image_token != data::kShapesImgPad)
            bad(
                fmt::format("vision.image_token = {} with data.format = \"shapes\": the shapes vocabulary's <img_pad> "
                            "is {}",
                            v.image_token,
                            data::kShapesImgPad));
        if (c.model.vocab_size < data::kShapesVocabSize)
            bad(fmt::format("model.vocab_size = {} is below the shapes vocabulary's {} words",
                            c.model.vocab_size,
                            data::kShapesVocabSize));
        if (c.model.document_mask && c.model.eot_token != data::kShapesEos)
            bad(fmt::format("data.eot_token = {} with data.format = \"shapes\": samples end with <eos> = {}",
                            c.model.eot_token,
                            data::kShapesEos));
        if (v.patch != 14)
            bad(fmt::format("vision.patch = {}: the shapes images are cut into 14-pixel patches", v.patch));
        data::ShapesOptions sized;
        sized.max_objects = static_cast<int>(c.data.shapes.max_objects);
        sized.format = c.data.shapes.format;
        sized.stage = static_cast<int>(c.data.shapes.stage);
        sized.max_canvas = static_cast<int>(c.data.shapes.max_canvas);
        if (std::find(data::kShapesCanvasSizes.begin(), data::kShapesCanvasSizes.end(), sized.max_canvas) ==
            data::kShapesCanvasSizes.end())
            bad(fmt::format("data.shapes.max_canvas = {} must be one of 112, 168, 224, 280, 336", sized.max_canvas));
        // The largest image any view of this job shows: the training canvases, or a resolution control's.
        int side = sized.max_canvas;
        for (const ShapesControl control : c.data.shapes.controls)
            if (control == ShapesControl::res336) side = std::max(side, 336);
        data::ShapesOptions largest = sized;
        largest.max_canvas = side;
        const int64_t longest = data::ShapesBatcher::max_sample_tokens(largest);
        if (c.train.seq_len < longest)
            bad(
                fmt::format("train.seq_len = {} is shorter than the longest shapes sample, {} tokens (a {}x{} "
                            "image's {} slots and the longest text of data.shapes.max_objects = {})",
                            c.train.seq_len,
                            longest,
                            side,
                            side,
                            (side / 28) * (side / 28),
                            c.data.shapes.max_objects));
    }
    const nn::MoeModalityBias modality_bias = c.model.moe.modality_bias;
    if (modality_bias != nn::MoeModalityBias::off) {
        const std::string key = fmt::format("moe.modality_bias = \"{}\"", nn::enum_name(modality_bias));
        if (!c.model.moe_enabled || c.model.n_moe_layers() == 0)
            bad(key + " needs MoE layers: set moe.enabled = true (and moe.first_k_dense below model.n_layers)");
        if (!v.enabled() || !c.data.images())
            bad(key +
                " routes by token modality: it needs image + text batches (data.format = \"shapes\") and a "
                "vision encoder (vision.layers > 0)");
        const nn::MoeBalanceMode balance = c.model.moe.balance.mode;
        if (modality_bias == nn::MoeModalityBias::balanced && balance != nn::MoeBalanceMode::quantile &&
            balance != nn::MoeBalanceMode::sign_bias)
            bad(
                fmt::format("{} keeps a balancer per modality: it needs moe.balance = \"quantile\" or "
                            "\"sign_bias\", not \"{}\"",
                            key,
                            nn::enum_name(balance)));
    }
    if (!v.enabled()) return;
    if (v.dim % v.heads != 0 || (v.rope2d() && v.head_dim() % 4 != 0))
        bad(
            fmt::format("vision.dim = {} over vision.heads = {} must give a whole head dim, a multiple of 4 with "
                        "vision.pos = \"rope2d\" (the 2-D RoPE rotates a quarter of it by rows and a quarter by "
                        "columns)",
                        v.dim,
                        v.heads));
    if (v.image_token < 0 || v.image_token >= c.model.vocab_size)
        bad(fmt::format("vision.image_token = {} must be an id of the vocabulary [0, {}) with vision.layers = {}",
                        v.image_token,
                        c.model.vocab_size,
                        v.layers));
    const auto& p = c.parallel;
    if (p.tp > 1 || p.cp > 1)
        bad(
            fmt::format("vision.layers = {} with parallel.tp = {}, cp = {}: image batches run with data, expert and "
                        "pipeline parallelism only yet (docs/multimodal.md)",
                        v.layers,
                        p.tp,
                        p.cp));
    if (c.model.segments.enabled() || c.long_ctx.tokens_per_gpu > 0 || !c.long_ctx.stages.empty())
        bad("vision.layers > 0 with sequence segments or a [long] curriculum: image batches run as one pass yet "
            "(docs/multimodal.md)");
}

}  // namespace mt::train
