// TensorBoard event-file writer: the protobuf wire format written by hand (varints, fixed 32/64-bit fields and
// length-delimited fields are all an Event needs), framed as TFRecords with masked CRC-32C.
#include "train/tensorboard.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "core/crc32c.h"
#include "core/error.h"
#include "core/file_util.h"
#include "train/metrics.h"

namespace mt::train {

namespace {

constexpr const char* kIoHint =
    "make the run directory writable (or free space on its file system), or set "
    "metrics.tensorboard = false";

void put_varint(std::string& out, uint64_t v) {
    while (v >= 0x80) {
        out.push_back(static_cast<char>((v & 0x7F) | 0x80));
        v >>= 7;
    }
    out.push_back(static_cast<char>(v));
}

// Little-endian bytes of a fixed-width value (every target moetrain builds for is little-endian, as the file is).
template <typename T>
void put_fixed(std::string& out, T v) {
    char bytes[sizeof(T)];
    std::memcpy(bytes, &v, sizeof(T));
    out.append(bytes, sizeof(T));
}

// A length-delimited field: the tag byte, the varint length, the bytes.
void put_bytes(std::string& out, char tag, std::string_view bytes) {
    out.push_back(tag);
    put_varint(out, bytes.size());
    out.append(bytes);
}

// Event fields 1 (wall_time, 64-bit) and 2 (step, varint). A zero step is left out, as protobuf's serializer does.
std::string event_head(double wall_time, int64_t step) {
    std::string out;
    out.push_back('\x09');
    put_fixed(out, wall_time);
    if (step != 0) {
        out.push_back('\x10');
        put_varint(out, static_cast<uint64_t>(step));  // int64 varints are the two's-complement bits
    }
    return out;
}

}  // namespace

std::vector<TensorBoardScalar> tensorboard_scalars(const std::string& kind, const nlohmann::json& fields) {
    std::vector<TensorBoardScalar> out;
    for (const auto& [key, value] : fields.items()) {
        if (value.is_boolean())
            out.emplace_back(metric_path(kind, key), value.get<bool>() ? 1.0f : 0.0f);
        else if (value.is_number())
            out.emplace_back(metric_path(kind, key), static_cast<float>(value.get<double>()));
    }
    return out;
}

std::string tensorboard_record(std::string_view payload) {
    std::string out;
    const uint64_t n = payload.size();
    put_fixed(out, n);
    put_fixed(out, core::masked_crc32c(core::crc32c(&n, sizeof(n))));
    out.append(payload);
    put_fixed(out, core::masked_crc32c(core::crc32c(payload.data(), payload.size())));
    return out;
}

std::string tensorboard_event_file_version(double wall_time) {
    std::string out = event_head(wall_time, 0);
    put_bytes(out, '\x1A', "brain.Event:2");
    return out;
}

std::string tensorboard_event_scalars(double wall_time, int64_t step, const std::vector<TensorBoardScalar>& scalars) {
    std::string summary;
    for (const auto& [tag, value] : scalars) {
        std::string v;
        put_bytes(v, '\x0A', tag);
        v.push_back('\x15');
        put_fixed(v, value);
        put_bytes(summary, '\x0A', v);
    }
    std::string out = event_head(wall_time, step);
    put_bytes(out, '\x2A', summary);
    return out;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir, double wall_time) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec)
        core::fail_hint(
            core::ExitCode::io, kIoHint, "cannot create the TensorBoard directory: {} [{}]", ec.message(), dir);
    path_ = fmt::format("{}/events.out.tfevents.{}.{}.{}",
                        dir,
                        static_cast<int64_t>(std::floor(wall_time)),
                        core::host_name("localhost"),
                        static_cast<int64_t>(::getpid()));
    // O_EXCL: two processes never share a file (the name holds the pid, but a restarted job may reuse it).
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
    if (fd_ < 0)
        core::fail_hint(core::ExitCode::io,
                        kIoHint,
                        "cannot create the TensorBoard event file: {} [{}]",
                        std::strerror(errno),
                        path_);
    append(tensorboard_record(tensorboard_event_file_version(wall_time)));
}

TensorBoardWriter::~TensorBoardWriter() {
    if (fd_ >= 0) ::close(fd_);
}

void TensorBoardWriter::write(int64_t step, double wall_time, const std::vector<TensorBoardScalar>& scalars) {
    if (scalars.empty()) return;
    append(tensorboard_record(tensorboard_event_scalars(wall_time, step, scalars)));
}

void TensorBoardWriter::append(const std::string& record) {
    size_t done = 0;
    while (done < record.size()) {
        const ssize_t w = ::write(fd_, record.data() + done, record.size() - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0)
            core::fail_hint(core::ExitCode::io,
                            kIoHint,
                            "cannot write the TensorBoard event file: {} [{}]",
                            std::strerror(w < 0 ? errno : ENOSPC),
                            path_);
        done += static_cast<size_t>(w);
    }
}

}  // namespace mt::train
