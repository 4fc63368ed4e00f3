// TensorBoard event files (conventions §7.3): TFRecords holding hand-encoded Event protobufs, so that no protobuf
// library is needed. A view of the JSONL log: one Event per logged line with that line's scalars.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace mt::train {

// A scalar as TensorBoard stores it: the tag and a float32 (NaN and infinities are kept as they are).
using TensorBoardScalar = std::pair<std::string, float>;

// The scalars of one JSONL line, tagged by metric_path (train/metrics.h): numbers and booleans (0/1), NaN and
// infinities included; arrays (per-expert loads) and strings are left out.
std::vector<TensorBoardScalar> tensorboard_scalars(const std::string& kind, const nlohmann::json& fields);

// One TFRecord: u64 LE length, u32 LE masked CRC-32C of the length bytes, the payload, u32 LE masked CRC-32C of it.
std::string tensorboard_record(std::string_view payload);

// The serialized Event{wall_time, file_version = "brain.Event:2"} that opens every event file.
std::string tensorboard_event_file_version(double wall_time);

// The serialized Event{wall_time, step, summary{value{tag, simple_value}...}}.
std::string tensorboard_event_scalars(double wall_time, int64_t step, const std::vector<TensorBoardScalar>& scalars);

// Appends events to `<dir>/events.out.tfevents.<unix_secs>.<hostname>.<pid>`, created with the file_version record.
// Every record goes out in one write(2), so a crash loses at most the record being written, and TensorBoard sees each
// step as soon as it is logged. A resumed run opens a new file in the same directory; TensorBoard reads them all.
class TensorBoardWriter {
   public:
    // Creates dir when missing; an uncreatable directory or unwritable file is exit 9 naming the path.
    // @param[in] dir        the directory (`<run.dir>/tb`)
    // @param[in] wall_time  unix seconds of the file_version record (and the name's <unix_secs>)
    TensorBoardWriter(const std::string& dir, double wall_time);
    ~TensorBoardWriter();
    TensorBoardWriter(const TensorBoardWriter&) = delete;
    TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

    // Appends one Event with the scalars; none: nothing is written.
    void write(int64_t step, double wall_time, const std::vector<TensorBoardScalar>& scalars);

    const std::string& path() const {
        return path_;
    }

   private:
    void append(const std::string& record);
    std::string path_;
    int fd_ = -1;
};

}  // namespace mt::train
