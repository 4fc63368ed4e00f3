// JSONL metrics writer: one write(2) per line on an O_APPEND descriptor, with the file cut back to the line
// boundary when a write fails part-way; then the views of train and eval lines.
#include "train/metrics.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "train/prometheus.h"
#include "train/tensorboard.h"

namespace mt::train {

namespace {

constexpr const char* kIoHint =
    "free space on the run directory's file system (or make it writable), then resume with --resume";

// Cuts the file back to just after its last '\n' when it does not end with one; returns the bytes cut.
off_t cut_torn_tail(int fd, const std::string& path) {
    struct stat st {};
    if (::fstat(fd, &st) != 0 || st.st_size == 0) return 0;
    char buf[4096];
    off_t end = st.st_size;
    while (end > 0) {
        const off_t begin = end > static_cast<off_t>(sizeof(buf)) ? end - static_cast<off_t>(sizeof(buf)) : 0;
        const ssize_t n = ::pread(fd, buf, static_cast<size_t>(end - begin), begin);
        if (n != end - begin)
            core::fail(core::ExitCode::io, "cannot read the metrics log: {} [{}]", std::strerror(errno), path);
        for (ssize_t i = n - 1; i >= 0; --i) {
            if (buf[i] != '\n') continue;
            const off_t keep = begin + i + 1;
            if (keep == st.st_size) return 0;
            if (::ftruncate(fd, keep) != 0)
                core::fail(core::ExitCode::io, "cannot cut the metrics log: {} [{}]", std::strerror(errno), path);
            return st.st_size - keep;
        }
        end = begin;
    }
    if (::ftruncate(fd, 0) != 0)
        core::fail(core::ExitCode::io, "cannot cut the metrics log: {} [{}]", std::strerror(errno), path);
    return st.st_size;
}

}  // namespace

std::string metric_path(const std::string& kind, const std::string& key) {
    if (key.find('/') != std::string::npos) return key;
    if (kind == "eval" && key.starts_with("val_")) return "eval/" + key.substr(4);
    return kind + "/" + key;
}

MetricsLog::MetricsLog(const std::string& path, const MetricsViews& views) : path_(path) {
    if (!views.tensorboard_dir.empty())
        tensorboard_ = std::make_unique<TensorBoardWriter>(views.tensorboard_dir, unix_seconds());
    if (!views.prometheus_path.empty())
        prometheus_ = std::make_unique<PrometheusFile>(
            views.prometheus_path, PrometheusOptions{.job = views.job, .per_expert = views.prometheus_per_expert});
    if (path.empty()) return;
    fd_ = ::open(path.c_str(), O_RDWR | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0)
        core::fail_hint(core::ExitCode::io,
                        kIoHint,
                        "cannot open the metrics log for writing: {} [{}]",
                        std::strerror(errno),
                        path);
    if (const off_t cut = cut_torn_tail(fd_, path); cut > 0)
        fmt::print(
            "moetrain: warning: the metrics log ended in a torn line ({} bytes, from a run that died while "
            "writing it); cut it off [{}]\n",
            cut,
            path);
}

MetricsLog::~MetricsLog() {
    if (fd_ >= 0) ::close(fd_);
}

void MetricsLog::write(int64_t step, const std::string& kind, const nlohmann::json& fields) {
    // One time for the line and its views. The JSONL first: it is the source of truth.
    const double time = unix_seconds();
    if (fd_ >= 0) write_jsonl(step, time, kind, fields);
    for (const auto& sink : sinks_) sink->on_line(step, time, kind, fields);
    if (kind != "train" && kind != "eval") return;
    if (tensorboard_) tensorboard_->write(step, time, tensorboard_scalars(kind, fields));
    if (prometheus_) prometheus_->update({.kind = kind, .step = step, .fields = fields});
}

void MetricsLog::add_sink(std::shared_ptr<MetricsSink> sink) {
    sinks_.push_back(std::move(sink));
}

void MetricsLog::write_jsonl(int64_t step, double time, const std::string& kind, const nlohmann::json& fields) {
    nlohmann::json line = {{"step", step}, {"time", time}, {"kind", kind}};
    nlohmann::json nonfinite = nlohmann::json::array();
    for (const auto& [key, value] : fields.items()) {
        if (value.is_number_float() && !std::isfinite(value.get<double>())) {
            line[key] = nullptr;
            nonfinite.push_back(key);
        } else {
            line[key] = value;
        }
    }
    if (!nonfinite.empty()) line["nonfinite"] = nonfinite;
    const std::string text = line.dump() + "\n";
    // Only this process appends, so the size before the write is where the line starts.
    struct stat st {};
    const off_t start = ::fstat(fd_, &st) == 0 ? st.st_size : -1;
    size_t done = 0;
    while (done < text.size()) {
        const ssize_t w = ::write(fd_, text.data() + done, text.size() - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            const int err = w < 0 ? errno : ENOSPC;
            // Back to the last complete line; should even that fail, the next open cuts the torn line.
            if (start >= 0 && done > 0) (void)!::ftruncate(fd_, start);
            core::fail_hint(
                core::ExitCode::io, kIoHint, "cannot write the metrics log: {} [{}]", std::strerror(err), path_);
        }
        done += static_cast<size_t>(w);
    }
}

double unix_seconds() {
    using namespace std::chrono;
    return duration<double>(system_clock::now().time_since_epoch()).count();
}

}  // namespace mt::train
