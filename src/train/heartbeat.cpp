// Heartbeat files (operations.md §1). The write is temp + rename without fsync: a beat that a crash loses is
// replaced by the next one, and the supervisor reads only the newest.
#include "train/heartbeat.h"

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/file_util.h"

namespace mt::train {

const char* phase_name(Phase p) {
    switch (p) {
        case Phase::data:
            return "data";
        case Phase::forward:
            return "forward";
        case Phase::backward:
            return "backward";
        case Phase::optimizer:
            return "optimizer";
        case Phase::checkpoint:
            return "checkpoint";
        case Phase::eval:
            return "eval";
    }
    return "unknown";
}

Heartbeat::Heartbeat(const std::string& run_dir, int rank, int64_t step, double interval_s)
    : host_(core::host_name("unknown")), rank_(rank), interval_s_(interval_s), step_(step) {
    MT_CHECK(interval_s > 0.0, "heartbeat interval {} s must be positive", interval_s);
    const std::filesystem::path dir = std::filesystem::path(run_dir) / "heartbeat";
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec || !std::filesystem::is_directory(dir))
        core::fail(core::ExitCode::io,
                   "cannot create the heartbeat directory {}: {}",
                   dir.string(),
                   ec ? ec.message() : "a file is in the way");
    path_ = (dir / ("rank_" + std::to_string(rank) + ".json")).string();
    beat();
    thread_ = std::thread([this] { loop(); });
}

Heartbeat::~Heartbeat() {
    {
        const std::lock_guard<std::mutex> lock(wake_mutex_);
        stop_ = true;
    }
    wake_.notify_all();
    thread_.join();
}

void Heartbeat::step_end(int64_t step, double seconds) {
    step_.store(step);
    step_seconds_.store(seconds);
    phase_.store(Phase::data);
    beat();
}

void Heartbeat::beat() {
    const nlohmann::json j = {
        {"rank", rank_},
        {"host", host_},
        {"pid", static_cast<int64_t>(getpid())},
        {"step", step_.load()},
        {"phase", phase_name(phase_.load(std::memory_order_relaxed))},
        {"time", std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count()},
        {"step_time_s", step_seconds_.load()}};
    const std::lock_guard<std::mutex> lock(write_mutex_);
    const std::string tmp = path_ + ".tmp";
    {
        std::ofstream out(tmp, std::ios::trunc);
        out << j.dump() << '\n';
        if (!out) core::fail(core::ExitCode::io, "cannot write the heartbeat file {}", tmp);
    }
    std::error_code ec;
    std::filesystem::rename(tmp, path_, ec);
    if (ec) core::fail(core::ExitCode::io, "cannot rename {} to {}: {}", tmp, path_, ec.message());
}

void Heartbeat::loop() {
    std::unique_lock<std::mutex> lock(wake_mutex_);
    const auto interval = std::chrono::duration<double>(interval_s_);
    while (!wake_.wait_for(lock, interval, [this] { return stop_; })) {
        lock.unlock();
        try {
            beat();
        } catch (const core::Error&) {
            // A beat the thread cannot write (a full disk) is not the training's failure: the step end's beat
            // reports it on the main thread.
        }
        lock.lock();
    }
}

}  // namespace mt::train
