// Forward and backward of the vision tower (nn::VisionEncoder: the ViT and the projector, multimodal.md §1-§2) as
// training runs it, on one packed batch of images of mixed sizes: one JSON line.
//   bench_vit [--dim 1152] [--layers 27] [--heads 16] [--mlp 4304] [--patch 14] [--d-model 2048]
//             [--images 448x448,336x448,224x336,448x224] [--num-images 16] [--iters 10] [--warmup 3]
//             [--nondeterministic] [--cpu]
// Default: the reference ViT (SigLIP-SO400M's shape, head dim 72) on 16 images cycling through the --images list
// (10752 patches, 2688 LM tokens). On the GPU the encoder runs in bf16 mixed precision (nn::Precision::cuda_bf16:
// bf16 activations and weights, f32 statistics and gradients), the trainer's setting; each figure is the median of
// `iters` CUDA-event timings after `warmup` runs. The forward includes what the trainer's forward does per batch:
// the patches' conversion to bf16 on the host and their copy to the device (timed alone as input_copy_ms), and the
// positions' copy. --cpu runs f32 on the CPU with wall-clock timing (a smoke test for tiny shapes; the figures mean
// little).
// FLOPs: nn::vision_forward_flops (nn/vision/vision_flops.h, docs/PERFORMANCE.md "Vision"), the trainer's count: per
// image of n patches, 2·n·588·d (patch embedding), per layer n·2·(4d² + 2d·mlp) (q, k, v, o and the MLP) plus 4·n²·d
// (QK^T and PV over the image's whole square: bidirectional), the projector (n/4)·2·(4d·d_p + d_p·d_model); a step is
// 3x the forward. Also timed alone: one layer's attention at the same shapes (the kernels `impl` names).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/blas_kernels.h"
#include "core/error.h"
#include "core/exec.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "gpu_timing.h"
#include "nn/vision/vision_encoder.h"
#include "nn/vision/vision_flops.h"
#include "ops/attention.h"

namespace {

using mt::core::Device;
using mt::core::DType;
using mt::core::Tensor;

// Image sizes in pixels, "HxW,HxW,...".
std::vector<mt::nn::ImageGrid> parse_images(const std::string& list, int64_t patch, int64_t count) {
    std::vector<mt::nn::ImageGrid> sizes;
    size_t at = 0;
    while (at <= list.size()) {
        const size_t comma = std::min(list.find(',', at), list.size());
        const std::string item = list.substr(at, comma - at);
        const size_t x = item.find('x');
        MT_CHECK(x != std::string::npos, "--images: \"{}\" is not HxW", item);
        const int64_t h = std::stoll(item.substr(0, x)), w = std::stoll(item.substr(x + 1));
        MT_CHECK(h > 0 && w > 0 && h % (2 * patch) == 0 && w % (2 * patch) == 0,
                 "--images: {}x{} is not a multiple of two patches ({} pixels) on both sides",
                 h,
                 w,
                 2 * patch);
        sizes.push_back({h / patch, w / patch});
        at = comma + 1;
    }
    std::vector<mt::nn::ImageGrid> grids;
    for (int64_t i = 0; i < (count > 0 ? count : std::ssize(sizes)); ++i)
        grids.push_back(sizes[static_cast<size_t>(i) % sizes.size()]);
    return grids;
}

int run(int argc, char** argv) {
    CLI::App app{"moetrain vision tower (ViT + projector) forward/backward benchmark"};
    mt::nn::VisionConfig cfg;
    cfg.dim = 1152, cfg.layers = 27, cfg.heads = 16, cfg.mlp = 4304, cfg.patch = 14;
    int64_t d_model = 2048, num_images = 16;
    std::string images = "448x448,336x448,224x336,448x224";
    int iters = 10, warmup = 3;
    bool nondeterministic = false, cpu = false;
    app.add_option("--dim", cfg.dim, "d_v");
    app.add_option("--layers", cfg.layers, "L_v");
    app.add_option("--heads", cfg.heads);
    app.add_option("--mlp", cfg.mlp, "the MLP's hidden width");
    app.add_option("--patch", cfg.patch, "pixels per patch side");
    app.add_option("--d-model", d_model, "the LM's hidden size (the projector's output)");
    app.add_option("--images", images, "image sizes in pixels, HxW, comma-separated, cycled");
    app.add_option("--num-images", num_images, "images in the batch (0: the list once)");
    app.add_option("--iters", iters)->check(CLI::PositiveNumber);
    app.add_option("--warmup", warmup);
    app.add_flag("--nondeterministic", nondeterministic, "let ops use non-deterministic kernels (float atomics)");
    app.add_flag("--cpu", cpu, "run f32 on the CPU (tiny shapes: the smoke test)");
    CLI11_PARSE(app, argc, argv);
    mt::core::set_default_exec({mt::core::Lane::main, !nondeterministic});
    const Device dev = cpu ? Device::cpu : Device::cuda;
    if (!cpu && !mt::core::backend_available(Device::cuda)) {
        std::printf("%s\n", nlohmann::json{{"bench", "vit"}, {"skipped", "no CUDA device"}}.dump().c_str());
        return 0;
    }
    const auto time = [&](const std::function<void()>& fn) { return mt::bench::time_ms_on(dev, fn, warmup, iters); };
    mt::core::Backend& be = mt::core::backend_get(dev);
    const std::vector<mt::nn::ImageGrid> grids = parse_images(images, cfg.patch, num_images);
    std::vector<std::string> sizes;
    for (const mt::nn::ImageGrid& g : grids)
        sizes.push_back(std::to_string(g.h * cfg.patch) + "x" + std::to_string(g.w * cfg.patch));

    mt::nn::ParamTable table;
    mt::nn::VisionEncoder enc(table, cfg, d_model);
    table.finalize(cpu ? mt::nn::Precision::cpu(DType::f32) : mt::nn::Precision::cuda_bf16());
    table.initialize(1);
    const DType act = table.precision().compute;

    mt::nn::VisionBatch batch;
    batch.grids = grids;
    batch.patches = Tensor::zeros({batch.num_patches(), cfg.patch_values()}, DType::f32);
    mt::core::rng_fill_uniform(batch.patches, 2, 0, -1.0, 1.0);  // normalised pixels lie in [-1, 1]
    const int64_t p = batch.num_patches(), tokens = batch.num_tokens();
    Tensor d_tokens = Tensor::zeros({tokens, d_model}, DType::f32);
    mt::core::rng_fill_normal(d_tokens, 3, 0, 0.0, 1.0);
    d_tokens = d_tokens.to(act).to_device(dev);

    be.synchronize();
    const size_t before = be.bytes_in_use();
    be.reset_peak();
    enc.forward(batch);
    enc.backward(d_tokens);
    be.synchronize();
    const size_t peak = be.peak_bytes();
    const bool finite = mt::bench::all_finite(enc.forward(batch)) && mt::bench::all_finite(table.grad_arena());

    const double fwd_ms = time([&] { enc.forward(batch); });
    const double bwd_ms = time([&] { enc.backward(d_tokens); });
    // The part of the forward that is the patches' conversion to the compute dtype on the host and their copy.
    const double input_ms = time([&] { (void)batch.patches.to(act).to_device(dev); });
    const double step_ms = time([&] {
        enc.forward(batch);
        enc.backward(d_tokens);
    });

    // One layer's attention alone at the same shapes, with the kernels it ran.
    const int64_t heads = cfg.heads, hd = cfg.head_dim();
    const auto rand_act = [&](uint64_t seed) {
        Tensor t = Tensor::zeros({1, p, heads, hd}, DType::f32);
        mt::core::rng_fill_normal(t, seed, 0, 0.0, 1.0);
        return t.to(act).to_device(dev);
    };
    const Tensor q = rand_act(4), k = rand_act(5), v = rand_act(6), dout = rand_act(7);
    const Tensor out = Tensor::zeros(q.shape(), act, dev), dq = Tensor::zeros(q.shape(), act, dev),
                 dk = Tensor::zeros(q.shape(), act, dev), dv = Tensor::zeros(q.shape(), act, dev);
    const Tensor lse = Tensor::zeros({1, heads, p}, DType::f32, dev);
    const mt::nn::VisionPositions pos = mt::nn::VisionPositions::make(grids, dev);
    const mt::ops::AttentionMask mask{.doc_start = pos.doc_start, .causal = false};
    std::string fwd_impl, bwd_impl;
    mt::ops::AttentionOptions options;
    options.chosen = &fwd_impl;
    const double attn_fwd_ms = time([&] { mt::ops::attention_fwd(q, k, v, out, lse, options, mask); });
    options.chosen = &bwd_impl;
    const double attn_bwd_ms =
        time([&] { mt::ops::attention_bwd(q, k, v, out, lse, dout, dq, dk, dv, options, mask); });

    const double fwd_flop = mt::nn::vision_forward_flops(cfg, d_model, grids);
    const nlohmann::json line = {{"bench", "vit"},
                                 {"impl",
                                  std::string(cpu ? "moetrain cpu f32" : "moetrain cuda bf16") +
                                      (cpu ? "" : " attention fwd=" + fwd_impl + " bwd=" + bwd_impl)},
                                 {"device", cpu ? "cpu" : "cuda"},
                                 {"deterministic", mt::core::exec().deterministic},
                                 {"dim", cfg.dim},
                                 {"layers", cfg.layers},
                                 {"heads", cfg.heads},
                                 {"head_dim", hd},
                                 {"mlp", cfg.mlp},
                                 {"patch", cfg.patch},
                                 {"d_model", d_model},
                                 {"images", std::ssize(grids)},
                                 {"image_sizes", sizes},
                                 {"patches", p},
                                 {"tokens", tokens},
                                 {"params", table.total_numel()},
                                 {"fwd_ms", fwd_ms},
                                 {"bwd_ms", bwd_ms},
                                 {"step_ms", step_ms},
                                 {"input_copy_ms", input_ms},
                                 {"fwd_gflop", fwd_flop / 1e9},
                                 {"tflops", 3.0 * fwd_flop / step_ms / 1e9},
                                 {"attn_layer_fwd_ms", attn_fwd_ms},
                                 {"attn_layer_bwd_ms", attn_bwd_ms},
                                 {"peak_bytes", peak},
                                 {"activation_bytes", peak > before ? peak - before : 0},
                                 {"outputs_finite", finite},
                                 {"iters", iters}};
    std::printf("%s\n", line.dump().c_str());
    std::fflush(stdout);
    return finite ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
    mt::core::blas_select_kernels(argv);
    try {
        return run(argc, argv);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_vit: error: %s\n", e.what());
        return 1;
    }
}
