// Training-step throughput of a job config on this machine: one JSON line per case.
//   bench_train --config configs/tiny.toml [--steps 20] [--warmup 3] [--set section.key=value ...] [--profile]
// --profile adds one more step, run with the range profile of core/trace.h on (it synchronises around every op and
// layer, so its times add up to more than a step), and prints one JSON line per range name after the figures.
// Random tokens (written to a temporary shard) stand in for the corpus so the run needs no prepared data; the
// step is the trainer's own (forward, backward, global norm + clipping, AdamW). Under mpirun it runs the config's
// [parallel] layout over the job's ranks (tokens_per_s counts the global batch) and rank 0 prints. An image + text
// config (data.format = "shapes") trains on its generated samples and adds the image and text token rates, measured
// on the metrics steps (metrics.every).
#include <omp.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/backend.h"
#include "core/blas_kernels.h"
#include "core/rng.h"
#include "core/trace.h"
#include "data/llmc_shard.h"
#include "nn/layer_stats.h"
#include "ops/layer_stats.h"
#include "parallel/runtime.h"
#include "train/trainer.h"

namespace {

// The process's peak resident host memory (VmHWM of /proc/self/status; pinned buffers count once touched), 0 where
// unknown.
int64_t peak_host_bytes() {
    std::ifstream status("/proc/self/status");
    std::string line;
    while (std::getline(status, line))
        if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;  // "VmHWM:   123 kB"
    return 0;
}

int run(int argc, char** argv) {
    CLI::App app{"moetrain training-step benchmark"};
    std::string config = "configs/tiny.toml";
    std::vector<std::string> overrides;
    int64_t steps = 20, warmup = 3;
    app.add_option("--config", config);
    app.add_option("--steps", steps);
    app.add_option("--warmup", warmup);
    app.add_option("--set", overrides);
    bool profile = false;
    app.add_flag("--profile", profile, "print an op- and layer-level time profile of one extra step");
    CLI11_PARSE(app, argc, argv);

    auto cfg = mt::train::config_load(config, overrides);
    const std::string dir = std::filesystem::temp_directory_path() / ("mt_bench_" + std::to_string(getpid()));
    std::filesystem::create_directories(dir);
    // At least two rows' worth: a million-token row needs a million and one tokens.
    std::vector<int32_t> tokens(static_cast<size_t>(std::max<int64_t>(1 << 20, 2 * (cfg.train.seq_len + 1))));
    for (size_t i = 0; i < tokens.size(); ++i)
        tokens[i] = static_cast<int32_t>(mt::core::rng_u64(1, 0, i) % static_cast<uint64_t>(cfg.model.vocab_size));
    mt::data::llmc_write_shard(dir + "/bench.bin", tokens, cfg.model.vocab_size);
    cfg.data.paths = {dir + "/bench.bin"};
    cfg.data.val_paths = {};
    cfg.run.dir = dir + "/run";
    cfg.train.steps = warmup + steps + (profile ? 1 : 0);

    const auto setup_start = std::chrono::steady_clock::now();
    mt::train::Trainer trainer(cfg, false);
    // Building the model and drawing its weights (on the GPU for a cuda run, ops::rng_fill_normal: seconds; on the
    // host, minutes for billions of parameters), so it is printed.
    const double setup_secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - setup_start).count();
    // The trainer resets the allocator's peak as each step starts: the figure reported is the largest step's.
    int64_t peak = 0, reserved = 0, peak_activations = 0;
    for (int64_t s = 0; s < warmup; ++s) {
        const mt::train::StepResult r = trainer.train_step();
        peak = std::max(peak, r.mem_peak);
        peak_activations = std::max(peak_activations, r.mem_peak_activations);
    }
    const auto start = std::chrono::steady_clock::now();
    double comm_wait = 0.0, loss = 0.0, optim_secs = 0.0, muon_secs = 0.0;
    int64_t overlapped = 0;
    // Image + text configs: the image slots and all rows the splice saw on the metrics steps (nn/layer_stats.h).
    const int64_t splice = mt::nn::layer_stats_layout(cfg.model).splice();
    double image_rows = 0.0, all_rows = 0.0;
    for (int64_t s = 0; s < steps; ++s) {
        const mt::train::StepResult r = trainer.train_step();
        if (splice >= 0 && !r.layer_stats.empty()) {
            image_rows += r.layer_stats[static_cast<size_t>(splice)];
            all_rows += r.layer_stats[static_cast<size_t>(splice + mt::ops::kLayerStatsMoments)];
        }
        loss = r.loss;
        comm_wait += r.comm_seconds;
        optim_secs += r.optim.step_seconds;
        muon_secs += r.optim.muon_seconds;
        overlapped = r.buckets_overlapped;
        peak = std::max(peak, r.mem_peak);
        peak_activations = std::max(peak_activations, r.mem_peak_activations);
        reserved = r.mem_reserved;
    }
    const mt::core::Device device = trainer.model().params().precision().device;
    mt::core::backend_get(device).synchronize();
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::vector<mt::core::ProfileEntry> ranges;
    if (profile) {
        mt::core::profile_enable(device);
        trainer.train_step();
        ranges = mt::core::profile_take();
        mt::core::profile_disable();
    }
    std::filesystem::remove_all(dir);

    const double tok_s = static_cast<double>(trainer.tokens_per_step() * steps) / secs;
    // The last step's FLOPs as typical (a shapes step's images vary a little; the LM's count does not).
    const double flops = trainer.step_flops() * static_cast<double>(steps) / secs;
    // MFU against the dense bf16 peak of an H100/H200 (989 TFLOP/s); on the CPU GFLOP/s is the figure.
    const bool gpu = device == mt::core::Device::cuda;
    nlohmann::json line = {
        {"bench", "train_step"},
        {"impl", "moetrain"},
        {"config", config},
        {"batch", cfg.train.batch_size * cfg.train.grad_accum},
        {"seq", cfg.train.seq_len},
        {"steps", steps},
        {"ms_per_step", 1000.0 * secs / static_cast<double>(steps)},
        {"tokens_per_s", tok_s},
        {"flops_per_token", trainer.model().flops_per_token(cfg.train.seq_len)},
        {"gflops_per_s", flops / 1e9},
        {"threads", omp_get_max_threads()},
        {"device", std::string(mt::core::device_name(device))},
        {"params", trainer.model().params().total_numel()},
        {"setup_s", setup_secs},
        {"loss", loss},
        // The optimizer update's wall time on the host (StepResult::optim; on the GPU it includes the device's work
        // where the step reads results back, as the metrics steps do), and Muon's part of it.
        {"optim_ms", 1000.0 * optim_secs / static_cast<double>(steps)},
        {"muon_ms", 1000.0 * muon_secs / static_cast<double>(steps)},
        {"optimizer", cfg.optim.name},
        {"segments", static_cast<int64_t>(trainer.model().segment_bounds().size()) - 1},
        {"peak_host_bytes", peak_host_bytes()},
    };
    if (gpu) {
        line["mfu"] = flops / 989e12;
        line["peak_device_bytes"] = peak;
        line["reserved_device_bytes"] = reserved;
        // The peak less the trainer's state (weights, master weights, gradients, optimizer moments): the activations,
        // saved tensors and scratch.
        line["peak_activation_bytes"] = peak_activations;
        line["state_bytes"] = trainer.state_bytes();
        // train.cuda_graphs: how many forwards recorded their graphs and how many replayed them (both 0 without).
        line["graph_captures"] = trainer.model().graph_captures();
        line["graph_replays"] = trainer.model().graph_replays();
    }
    if (trainer.mesh().world().size() > 1) {
        // The host's wait for the gradient reduction after the backward (GPU: also the backward still queued),
        // and how many of the buckets were issued while the backward ran.
        line["comm_wait_ms"] = 1000.0 * comm_wait / static_cast<double>(steps);
        line["buckets_overlapped"] = overlapped;
        line["buckets"] = trainer.gradient_buckets();
    }
    if (all_rows > 0) {
        // Image tokens are the <img_pad> slots; text tokens every other position of the rows, row-end padding
        // included. The ViT's share of the step time is in the --profile lines (model.vision_fwd, model.vision_bwd).
        const double share = image_rows / all_rows;
        line["image_token_share"] = share;
        line["image_tokens_per_s"] = share * tok_s;
        line["text_tokens_per_s"] = (1.0 - share) * tok_s;
    }
    line["deterministic"] = cfg.run.deterministic;
    line["world"] = trainer.mesh().world().size();
    line["mesh"] = trainer.mesh().to_json();
    line["precision"] = mt::core::dtype_name(trainer.model().params().precision().compute);
    if (trainer.mesh().world().rank() != 0) return 0;
    fmt::print("{}\n", line.dump());
    for (const auto& r : ranges)
        fmt::print("{}\n",
                   nlohmann::json{{"bench", "train_step_profile"},
                                  {"range", r.name},
                                  {"ms", r.ms},
                                  {"calls", r.calls},
                                  {"ms_per_call", r.ms / static_cast<double>(r.calls)}}
                       .dump());
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    mt::core::blas_select_kernels(argv);
    return mt::parallel::dist_run_main(argc, argv, "bench_train", run);
}
