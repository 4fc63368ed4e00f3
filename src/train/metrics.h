// Metrics: the JSONL log (conventions §7.1), one line per record, non-finite values as null and listed under
// "nonfinite". Only rank 0 writes. Each line goes to the file whole or not at all: a write that fails part-way (a
// full disk) is cut back to the last complete line and ends the run with exit 9, and a torn last line left by a
// process killed mid-write is cut off when the log is opened again, so the next line never glues onto it.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace mt::train {

class MetricsLog {
   public:
    MetricsLog() = default;
    // Opens path for appending (a resumed run continues the same file), first cutting a last line that has no
    // '\n' (with a warning on stdout). Empty path: records are dropped. An unopenable file is exit 9.
    explicit MetricsLog(const std::string& path);
    ~MetricsLog();
    MetricsLog(const MetricsLog&) = delete;
    MetricsLog& operator=(const MetricsLog&) = delete;

    // Writes {"step", "time", "kind", ...fields}; numbers that are NaN or infinite become null. An I/O failure
    // leaves the file at its last complete line and throws Error(ExitCode::io) naming the file.
    void write(int64_t step, const std::string& kind, const nlohmann::json& fields);

   private:
    int fd_ = -1;
    std::string path_;
};

// Unix time in seconds.
double unix_seconds();

}  // namespace mt::train
