// TensorBoard event files: the golden records of conventions §7.3 byte for byte, and a reader written here from the
// spec (TFRecord framing, both masked CRCs, the Event/Summary wire format) reading the writer's files back.
#include "train/tensorboard.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "core/crc32c.h"
#include "core/error.h"
#include "core/file_util.h"
#include "support/tiny_job.h"
#include "train/metrics.h"

using mt::core::Error;
using mt::core::ExitCode;
using mt::testing::fresh_dir;
using mt::train::TensorBoardScalar;

namespace {

std::string bytes_of(std::initializer_list<int> values) {
    std::string out;
    for (const int v : values) out.push_back(static_cast<char>(v));
    return out;
}

std::string hex(const std::string& bytes) {
    std::string out;
    for (const unsigned char c : bytes) out += fmt::format("{:02X} ", c);
    return out;
}

struct Event {
    double wall_time = 0.0;
    int64_t step = 0;
    std::string file_version;
    std::vector<TensorBoardScalar> scalars;
};

// A protobuf reader over one message: fields are (number, wire type) and a value; fails on anything an Event
// written by moetrain does not hold.
class Wire {
   public:
    explicit Wire(std::string_view bytes) : s_(bytes) {}
    bool done() const {
        return pos_ == s_.size();
    }
    uint64_t varint() {
        uint64_t v = 0;
        for (int shift = 0; shift < 64; shift += 7) {
            if (pos_ >= s_.size()) throw std::runtime_error("varint runs past the message");
            const auto b = static_cast<uint8_t>(s_[pos_++]);
            v |= static_cast<uint64_t>(b & 0x7F) << shift;
            if ((b & 0x80) == 0) return v;
        }
        throw std::runtime_error("varint longer than 10 bytes");
    }
    std::string_view take(size_t n) {
        if (s_.size() - pos_ < n) throw std::runtime_error("field runs past the message");
        const std::string_view out = s_.substr(pos_, n);
        pos_ += n;
        return out;
    }
    template <typename T>
    T fixed() {
        T v;
        std::memcpy(&v, take(sizeof(T)).data(), sizeof(T));
        return v;
    }

   private:
    std::string_view s_;
    size_t pos_ = 0;
};

TensorBoardScalar decode_value(std::string_view bytes) {
    Wire w(bytes);
    TensorBoardScalar out;
    while (!w.done()) {
        const uint64_t key = w.varint();
        if (key == 0x0A)
            out.first = std::string(w.take(w.varint()));
        else if (key == 0x15)
            out.second = w.fixed<float>();
        else
            throw std::runtime_error(fmt::format("unexpected Summary.Value field key {}", key));
    }
    return out;
}

Event decode_event(std::string_view bytes) {
    Wire w(bytes);
    Event e;
    while (!w.done()) {
        const uint64_t key = w.varint();
        if (key == 0x09) {
            e.wall_time = w.fixed<double>();
        } else if (key == 0x10) {
            e.step = static_cast<int64_t>(w.varint());
        } else if (key == 0x1A) {
            e.file_version = std::string(w.take(w.varint()));
        } else if (key == 0x2A) {
            Wire summary(w.take(w.varint()));
            while (!summary.done()) {
                if (summary.varint() != 0x0A) throw std::runtime_error("unexpected Summary field");
                e.scalars.push_back(decode_value(summary.take(summary.varint())));
            }
        } else {
            throw std::runtime_error(fmt::format("unexpected Event field key {}", key));
        }
    }
    return e;
}

// Every record of an event file, both CRCs checked; throws naming the record on any damage.
std::vector<Event> read_events(const std::string& bytes) {
    std::vector<Event> out;
    Wire w(bytes);
    while (!w.done()) {
        const std::string_view head = w.take(8);
        uint64_t n;
        std::memcpy(&n, head.data(), 8);
        if (w.fixed<uint32_t>() != mt::core::masked_crc32c(mt::core::crc32c(head.data(), 8)))
            throw std::runtime_error(fmt::format("record {}: length CRC mismatch", out.size()));
        const std::string_view payload = w.take(n);
        if (w.fixed<uint32_t>() != mt::core::masked_crc32c(mt::core::crc32c(payload.data(), payload.size())))
            throw std::runtime_error(fmt::format("record {}: payload CRC mismatch", out.size()));
        out.push_back(decode_event(payload));
    }
    return out;
}

std::string only_event_file(const std::string& dir) {
    std::vector<std::string> files;
    for (const auto& entry : std::filesystem::directory_iterator(dir)) files.push_back(entry.path().string());
    EXPECT_EQ(files.size(), 1u);
    return files.empty() ? "" : files[0];
}

}  // namespace

TEST(TensorBoard, GoldenRecordsOfTheSpec) {
    const std::string file_version =
        bytes_of({0x18, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xA3, 0x7F, 0x4B, 0x22, 0x09, 0x00,
                  0x00, 0x00, 0x00, 0x00, 0x00, 0xF0, 0x3F, 0x1A, 0x0D, 0x62, 0x72, 0x61, 0x69, 0x6E,
                  0x2E, 0x45, 0x76, 0x65, 0x6E, 0x74, 0x3A, 0x32, 0x86, 0xBF, 0x57, 0x7A});
    const std::string step1 =
        bytes_of({0x1A, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x12, 0x9B, 0xD8, 0x2D, 0x09, 0x00,
                  0x00, 0x00, 0x00, 0x00, 0x00, 0xF0, 0x3F, 0x10, 0x01, 0x2A, 0x0D, 0x0A, 0x0B, 0x0A,
                  0x04, 0x6C, 0x6F, 0x73, 0x73, 0x15, 0x00, 0x00, 0xC0, 0x3F, 0xBF, 0xF2, 0xA3, 0x19});
    const std::string got_version = mt::train::tensorboard_record(mt::train::tensorboard_event_file_version(1.0));
    const std::string got_step =
        mt::train::tensorboard_record(mt::train::tensorboard_event_scalars(1.0, 1, {{"loss", 1.5f}}));
    EXPECT_EQ(hex(got_version), hex(file_version));
    EXPECT_EQ(hex(got_step), hex(step1));
    // The reader agrees with the golden bytes.
    const auto events = read_events(file_version + step1);
    ASSERT_EQ(events.size(), 2u);
    EXPECT_EQ(events[0].file_version, "brain.Event:2");
    EXPECT_EQ(events[1].step, 1);
    ASSERT_EQ(events[1].scalars.size(), 1u);
    EXPECT_EQ(events[1].scalars[0], (TensorBoardScalar{"loss", 1.5f}));
}

TEST(TensorBoard, TheReaderRejectsDamage) {
    const std::string good = mt::train::tensorboard_record(mt::train::tensorboard_event_scalars(1.0, 7, {{"a", 2.f}}));
    EXPECT_NO_THROW(read_events(good));
    for (const size_t at : {size_t{0}, size_t{9}, size_t{14}, good.size() - 1}) {
        std::string bad = good;
        bad[at] = static_cast<char>(bad[at] ^ 0x01);
        EXPECT_THROW(read_events(bad), std::runtime_error) << "byte " << at << " flipped";
    }
    EXPECT_THROW(read_events(good.substr(0, good.size() - 2)), std::runtime_error) << "truncated";
}

TEST(TensorBoard, WriterFilesReadBack) {
    const std::string dir = fresh_dir("tb") + "/tb";
    const float nan = std::nanf(""), inf = INFINITY;
    std::string path;
    {
        mt::train::TensorBoardWriter writer(dir, 1700000000.25);
        path = writer.path();
        writer.write(1, 1700000001.5, {{"train/loss", 5.5f}, {"moe/max_vio/l03", 0.25f}});
        writer.write(2, 1700000002.5, {});  // nothing to write
        writer.write(300, 1700000003.5, {{"train/loss", nan}, {"train/grad_norm", inf}, {"eval/loss", -inf}});
        // Every record is on disk as soon as it is written: no flush or close needed to read it.
        EXPECT_EQ(read_events(mt::core::read_file(path)).size(), 3u);
    }
    EXPECT_EQ(path, only_event_file(dir));
    char host[256] = {};
    ::gethostname(host, sizeof(host) - 1);
    EXPECT_EQ(std::filesystem::path(path).filename().string(),
              fmt::format("events.out.tfevents.1700000000.{}.{}", host, ::getpid()));
    const auto events = read_events(mt::core::read_file(path));
    ASSERT_EQ(events.size(), 3u);
    EXPECT_EQ(events[0].file_version, "brain.Event:2");
    EXPECT_EQ(events[0].wall_time, 1700000000.25);
    EXPECT_EQ(events[1].step, 1);
    EXPECT_EQ(events[1].wall_time, 1700000001.5);
    EXPECT_EQ(events[1].scalars, (std::vector<TensorBoardScalar>{{"train/loss", 5.5f}, {"moe/max_vio/l03", 0.25f}}));
    EXPECT_EQ(events[2].step, 300);  // a two-byte varint
    ASSERT_EQ(events[2].scalars.size(), 3u);
    EXPECT_TRUE(std::isnan(events[2].scalars[0].second));
    EXPECT_EQ(events[2].scalars[1].second, inf);
    EXPECT_EQ(events[2].scalars[2], (TensorBoardScalar{"eval/loss", -inf}));
}

// Through MetricsLog: one event per train and eval line, tags from metric_path, arrays and strings left out, events
// not written; the JSONL still gets every line.
TEST(TensorBoard, MetricsLogWritesTrainAndEvalLines) {
    const std::string dir = fresh_dir("log");
    {
        mt::train::MetricsViews views;
        views.tensorboard_dir = dir + "/tb";
        mt::train::MetricsLog log(dir + "/metrics.jsonl", views);
        log.write(0, "config", {{"config_toml", "x"}});
        log.write(1,
                  "train",
                  {{"loss", 2.5}, {"skipped", true}, {"moe/load/l01", {3, 4}}, {"note", "text"}, {"tokens_seen", 64}});
        log.write(1, "event", {{"event", "moe_collapse"}, {"layer", 1}});
        log.write(1, "eval", {{"val_loss", 3.0}});
    }
    const auto events = read_events(mt::core::read_file(only_event_file(dir + "/tb")));
    ASSERT_EQ(events.size(), 3u);
    EXPECT_EQ(events[1].step, 1);
    EXPECT_EQ(
        events[1].scalars,
        (std::vector<TensorBoardScalar>{{"train/loss", 2.5f}, {"train/skipped", 1.f}, {"train/tokens_seen", 64.f}}));
    EXPECT_EQ(events[2].scalars, (std::vector<TensorBoardScalar>{{"eval/loss", 3.f}}));
    // The JSONL time is the event's wall time; events go to the JSONL only.
    std::istringstream jsonl(mt::core::read_file(dir + "/metrics.jsonl"));
    std::vector<nlohmann::json> lines;
    for (std::string line; std::getline(jsonl, line);) lines.push_back(nlohmann::json::parse(line));
    ASSERT_EQ(lines.size(), 4u);
    EXPECT_EQ(lines[1]["time"].get<double>(), events[1].wall_time);
    EXPECT_EQ(lines[3]["time"].get<double>(), events[2].wall_time);
}

TEST(TensorBoard, UnwritableDirectoryIsOneIoError) {
    try {
        mt::train::TensorBoardWriter writer("/dev/null/tb", 1.0);
        FAIL() << "no error";
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ExitCode::io);
        EXPECT_NE(std::string(e.what()).find("/dev/null/tb"), std::string::npos) << e.what();
        EXPECT_NE(e.hint().find("metrics.tensorboard"), std::string::npos) << e.hint();
    }
}
