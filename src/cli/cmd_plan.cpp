// `moetrain plan --memory --config FILE [--set section.key=value ...] [--world N] [--device cpu|cuda|auto]
// [--json]`: the memory one rank of the job would hold (parallel/plan_memory.h, docs/memory_planning.md), from the
// config alone: no GPU is needed and nothing of the model is allocated. run.device = "auto" plans for the GPU (CUDA,
// bf16 mixed precision by default) wherever the command runs: a plan is made before one reaches the GPU.
#include <fmt/format.h>

#include "cli/commands.h"
#include "core/error.h"
#include "train/plan_input.h"

namespace mt::cli {

void register_plan(CLI::App& app) {
    auto* cmd = app.add_subcommand("plan", "predict a job's memory per rank from its config (no GPU needed)");
    struct Options {
        bool memory = false;
        std::string config;
        std::vector<std::string> overrides;
        int64_t world = 0;
        std::string device;
        bool json = false;
    };
    auto opts = std::make_shared<Options>();
    cmd->add_flag("--memory", opts->memory, "the memory plan: state, activations per layer type, workspace, peak");
    cmd->add_option("-c,--config", opts->config, "job config (TOML)")->required();
    cmd->add_option("--set", opts->overrides, "override a config value: section.key=value (repeatable)");
    cmd->add_option("--world", opts->world, "the job's process count, which parallel.dp = 0 fills (default: dp = 1)")
        ->check(CLI::PositiveNumber);
    cmd->add_option("--device", opts->device, "cpu, cuda or auto (overrides run.device; auto plans for cuda)")
        ->check(CLI::IsMember({"cpu", "cuda", "auto"}));
    cmd->add_flag("--json", opts->json, "print one JSON object instead of the table");
    cmd->callback([opts]() {
        if (!opts->memory)
            core::fail_hint(core::ExitCode::usage,
                            "run `moetrain plan --memory --config FILE`",
                            "moetrain plan: nothing to plan; pass --memory (the only plan so far)");
        if (!opts->device.empty()) opts->overrides.push_back("run.device=\"" + opts->device + "\"");
        const train::JobConfig cfg = train::config_load(opts->config, opts->overrides);
        const parallel::MemoryPlan plan = parallel::plan_memory(train::plan_memory_input(cfg, opts->world));
        if (opts->json)
            fmt::print("{}\n", parallel::memory_plan_json(plan).dump());
        else
            fmt::print("{}", parallel::memory_plan_table(plan));
    });
}

}  // namespace mt::cli
