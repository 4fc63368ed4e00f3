// Metrics: the JSONL log (conventions §7.1), one flushed line per record, non-finite values as null and listed
// under "nonfinite". Only rank 0 writes.
#pragma once

#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

namespace mt::train {

class MetricsLog {
   public:
    MetricsLog() = default;
    // Opens path for appending (a resumed run continues the same file). Empty path: records are dropped.
    explicit MetricsLog(const std::string& path);
    ~MetricsLog();
    MetricsLog(const MetricsLog&) = delete;
    MetricsLog& operator=(const MetricsLog&) = delete;

    // Writes {"step", "time", "kind", ...fields}; numbers that are NaN or infinite become null.
    void write(int64_t step, const std::string& kind, const nlohmann::json& fields);

   private:
    std::FILE* file_ = nullptr;
    std::string path_;
};

// Unix time in seconds.
double unix_seconds();

}  // namespace mt::train
