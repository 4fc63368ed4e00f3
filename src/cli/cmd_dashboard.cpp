// `moetrain dashboard --run DIR [--port P] [--bind ADDR]`: serves a run's metrics.jsonl the way a training serves
// its own (train/http_endpoint.h): the dashboard at /, /metrics and the JSON API, until SIGINT or SIGTERM (then exit
// 0). The file is read again every second, so a run still writing it (on this machine, without metrics.port) shows
// live too.
#include <toml++/toml.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "cli/commands.h"
#include "core/error.h"
#include "core/signals.h"
#include "train/http_endpoint.h"
#include "train/metrics_ring.h"

namespace mt::cli {

namespace {

constexpr int kSuggestedPort = 9477;
constexpr auto kFollowInterval = std::chrono::seconds(1);

// The run's name (the Prometheus job label), from the config line that opens metrics.jsonl; the directory's name when
// that line is missing or unreadable.
std::string run_name(const std::string& jsonl, const std::string& dir) {
    std::ifstream in(jsonl);
    std::string first;
    std::getline(in, first);
    const auto record = train::metrics_record_parse(first);
    if (record && record->kind == "config" && record->fields.contains("config_toml") &&
        record->fields["config_toml"].is_string()) {
        try {
            const toml::table config = toml::parse(record->fields["config_toml"].get<std::string>());
            if (const auto name = config["run"]["name"].value<std::string>()) return *name;
        } catch (const toml::parse_error&) {
        }
    }
    return std::filesystem::path(dir).lexically_normal().filename().string();
}

}  // namespace

void register_dashboard(CLI::App& app) {
    auto* cmd = app.add_subcommand("dashboard", "serve a run's metrics.jsonl as the live dashboard and /metrics");
    auto dir = std::make_shared<std::string>();
    auto port = std::make_shared<int>(kSuggestedPort);
    auto bind = std::make_shared<std::string>("127.0.0.1");
    cmd->add_option("--run", *dir, "the run directory (run.dir), holding metrics.jsonl")->required();
    cmd->add_option("--port", *port, "TCP port; 0 = a free one (printed)")->check(CLI::Range(0, 65535));
    cmd->add_option("--bind", *bind, "address to listen on; other than loopback serves other machines (a warning)");
    cmd->callback([dir, port, bind]() {
        const std::string jsonl = *dir + "/metrics.jsonl";
        if (!std::filesystem::is_regular_file(jsonl))
            core::fail_hint(core::ExitCode::usage,
                            "--run names a run directory: the run.dir of a training, which writes metrics.jsonl there",
                            "no metrics log in the run directory [{}]",
                            jsonl);
        if (!train::http_address_valid(*bind))
            core::fail(core::ExitCode::usage, "--bind \"{}\" is not a numeric IPv4 or IPv6 address", *bind);
        auto ring = std::make_shared<train::MetricsRing>();
        uint64_t offset = ring->load_jsonl(jsonl);
        train::http_warn_if_not_loopback(*bind, "--bind " + *bind);
        core::signals_install_stop(/*announce=*/false);
        const train::HttpEndpoint endpoint(ring,
                                           {.bind = *bind,
                                            .port = *port,
                                            .port_option = "--port",
                                            .jsonl_path = jsonl,
                                            .prometheus = {.job = run_name(jsonl, *dir)}});
        fmt::print("moetrain: serving {} at {} (Ctrl-C ends)\n", jsonl, endpoint.url());
        std::fflush(stdout);
        while (core::signals_stop_requested() == 0) {
            std::this_thread::sleep_for(kFollowInterval);
            try {
                offset = ring->load_jsonl(jsonl, offset);
            } catch (const core::Error&) {
                // The file went away: what was read stays served.
            }
        }
    });
}

}  // namespace mt::cli
