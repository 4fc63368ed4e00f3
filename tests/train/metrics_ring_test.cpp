// The metrics ring and the JSON answers built from it: bounds, event counters, the MetricsLog sink, reading
// metrics.jsonl (NaN restored, a torn last line left for later), concurrent use, and /api/series's patterns, file
// fallback, restart replay and thinning.
#include "train/metrics_ring.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <thread>

#include "core/error.h"
#include "support/tiny_job.h"
#include "train/metrics.h"
#include "train/metrics_series.h"

namespace {

using mt::testing::fresh_dir;
using mt::train::MetricsLog;
using mt::train::MetricsRing;
using nlohmann::json;

std::vector<int64_t> steps_of(const std::vector<mt::train::MetricsRecordPtr>& records) {
    std::vector<int64_t> out;
    for (const auto& r : records) out.push_back(r->step);
    return out;
}

TEST(MetricsRing, KeepsTheNewestLinesAndEventsAndCountsEveryEvent) {
    MetricsRing ring(3, 2);
    for (int64_t s = 1; s <= 5; ++s) ring.on_line(s, 0.0, "train", {{"loss", 1.0 / static_cast<double>(s)}});
    ring.on_line(5, 0.0, "eval", {{"val_loss", 2.0}});
    for (int64_t s = 1; s <= 3; ++s) ring.on_line(s, 0.0, "event", {{"event", "loss_spike"}});
    ring.on_line(5, 0.0, "config", {{"config_toml", "x"}});
    const MetricsRing::Snapshot held = ring.lines_since(0);
    EXPECT_EQ(steps_of(held.lines), (std::vector<int64_t>{4, 5, 5}));
    EXPECT_EQ(held.first_step, 4);
    EXPECT_TRUE(held.dropped);
    EXPECT_EQ(steps_of(ring.lines_since(5).lines), (std::vector<int64_t>{5, 5}));
    EXPECT_EQ(steps_of(ring.events_since(0)), (std::vector<int64_t>{2, 3}));
    EXPECT_EQ(ring.event_counts().alarms.at("loss_spike"), 3);
    const auto latest = ring.latest();
    ASSERT_EQ(latest.size(), 2u);
    EXPECT_EQ(latest[0].kind, "train");
    EXPECT_EQ(latest[0].fields["loss"], 0.2);
    EXPECT_EQ(latest[1].kind, "eval");
}

TEST(MetricsRing, AlarmAndRestartCounters) {
    MetricsRing ring;
    // Every alarm kind is there from the start, at 0.
    for (const char* kind : {"loss_spike", "grad_spike", "moe_collapse", "restart", "hang", "straggler"})
        EXPECT_EQ(ring.event_counts().alarms.at(kind), 0) << kind;
    ring.on_line(10, 0.0, "event", {{"event", "restart"}, {"reason", "hang"}});
    ring.on_line(20, 0.0, "event", {{"event", "restart"}, {"reason", "signal"}});
    ring.on_line(21, 0.0, "event", {{"event", "recovered"}});
    ring.on_line(22, 0.0, "event", {{"event", "memory_warning"}});
    ring.on_line(23, 0.0, "event", {{"event", "resumed"}});
    ring.on_line(24, 0.0, "event", {{"event", 7}});  // not a string: kept, counted as nothing
    const auto counts = ring.event_counts();
    EXPECT_EQ(counts.restarts, 2);
    EXPECT_EQ(counts.alarms.at("restart"), 2);
    EXPECT_EQ(counts.alarms.at("hang"), 1);
    EXPECT_EQ(counts.alarms.at("memory_warning"), 1);
    EXPECT_FALSE(counts.alarms.contains("recovered"));
    EXPECT_FALSE(counts.alarms.contains("resumed"));
    EXPECT_TRUE(mt::train::metrics_event_is_alarm("moe_imbalance_warning"));
    EXPECT_FALSE(mt::train::metrics_event_is_alarm("long_stage"));
}

// The log feeds the ring through its sink with the line's own time; the file and the ring agree.
TEST(MetricsRing, IsASinkOfTheLogAndReadsItsFile) {
    const std::string dir = fresh_dir("log");
    const std::string path = dir + "/metrics.jsonl";
    auto ring = std::make_shared<MetricsRing>();
    {
        MetricsLog log(path);
        log.add_sink(ring);
        log.write(0, "config", {{"config_toml", "[run]\nname = \"x\"\n"}});
        log.write(1, "train", {{"loss", 2.5}, {"grad_norm", std::nan("")}, {"moe/load/l01", {0.25, 0.75}}});
        log.write(1, "event", {{"event", "loss_spike"}, {"detail", "d"}});
        log.write(2, "train", {{"loss", 2.0}, {"grad_norm", 1.0}});
        log.write(2, "eval", {{"val_loss", 2.2}});
    }
    ASSERT_EQ(ring->lines_since(0).lines.size(), 3u);
    // A torn last line (a writer killed mid-line) is left for a later read.
    { std::ofstream(path, std::ios::app) << R"({"step":3,"time":1.0,"kind":"train","loss":1.5)"; }
    MetricsRing from_file;
    const uint64_t end = from_file.load_jsonl(path);
    EXPECT_LT(end, std::filesystem::file_size(path));
    const auto held = from_file.lines_since(0).lines;
    ASSERT_EQ(held.size(), 3u);
    EXPECT_FALSE(from_file.lines_since(0).dropped);
    EXPECT_EQ(held[0]->fields["loss"], 2.5);
    EXPECT_TRUE(std::isnan(held[0]->fields["grad_norm"].get<double>()));  // null + "nonfinite" -> NaN
    EXPECT_FALSE(held[0]->fields.contains("nonfinite"));
    EXPECT_EQ(held[0]->fields["moe/load/l01"], json({0.25, 0.75}));
    EXPECT_EQ(held[0]->time, ring->lines_since(0).lines[0]->time);
    EXPECT_EQ(from_file.event_counts().alarms.at("loss_spike"), 1);
    // The line completed: the next read from `end` adds it, and only it.
    { std::ofstream(path, std::ios::app) << "}\n"; }
    EXPECT_EQ(from_file.load_jsonl(path, end), std::filesystem::file_size(path));
    EXPECT_EQ(steps_of(from_file.lines_since(3).lines), (std::vector<int64_t>{3}));
    EXPECT_THROW(from_file.load_jsonl(dir + "/missing.jsonl"), mt::core::Error);
}

// A file longer than the ring: only the newest lines are held, every event is counted.
TEST(MetricsRing, ReadingALongFileKeepsTheNewestLines) {
    const std::string path = fresh_dir("long") + "/metrics.jsonl";
    {
        MetricsLog log(path);
        for (int64_t s = 1; s <= 50; ++s) {
            log.write(s, "train", {{"loss", static_cast<double>(s)}});
            if (s % 10 == 0) log.write(s, "event", {{"event", "grad_spike"}});
        }
        std::ofstream(path, std::ios::app) << "not json\n";
    }
    MetricsRing ring(8, 2);
    ring.load_jsonl(path);
    const MetricsRing::Snapshot held = ring.lines_since(0);
    EXPECT_EQ(held.lines.size(), 8u);
    EXPECT_EQ(held.first_step, 43);
    EXPECT_TRUE(held.dropped);
    EXPECT_EQ(ring.event_counts().alarms.at("grad_spike"), 5);
    EXPECT_EQ(steps_of(ring.events_since(0)), (std::vector<int64_t>{40, 50}));
}

// One writer appending while readers take snapshots: every snapshot is a bounded, ordered run of lines.
TEST(MetricsRing, OneWriterAndReadersTogether) {
    MetricsRing ring(256, 16);
    std::atomic<bool> done{false};
    std::vector<std::thread> readers;
    std::atomic<int64_t> snapshots{0};
    for (int r = 0; r < 2; ++r)
        readers.emplace_back([&] {
            while (!done) {
                const auto held = ring.lines_since(0).lines;
                EXPECT_LE(held.size(), 256u);
                for (size_t i = 1; i < held.size(); ++i) EXPECT_EQ(held[i]->step, held[i - 1]->step + 1);
                (void)ring.latest();
                (void)ring.event_counts();
                ++snapshots;
            }
        });
    // On a loaded machine the readers may not run before the writer ends: the writer waits for their first snapshots
    // before it starts and for more before it stops, so that some snapshots are taken while it writes.
    while (snapshots.load() < 2) std::this_thread::yield();
    const int64_t before = snapshots.load();
    for (int64_t s = 1; s <= 20000; ++s) {
        ring.on_line(s, 0.0, "train", {{"loss", 1.0}});
        if (s % 100 == 0) ring.on_line(s, 0.0, "event", {{"event", "loss_spike"}});
        if (s == 10000)
            while (snapshots.load() < before + 2) std::this_thread::yield();
    }
    done = true;
    for (auto& t : readers) t.join();
    EXPECT_GT(snapshots.load(), 0);
    EXPECT_EQ(ring.lines_since(0).first_step, 20000 - 255);
    EXPECT_EQ(ring.event_counts().alarms.at("loss_spike"), 200);
}

TEST(MetricsSeries, PatternsMatchWholeSegments) {
    using mt::train::metric_path_matches;
    EXPECT_TRUE(metric_path_matches("train/loss", "train/loss"));
    EXPECT_FALSE(metric_path_matches("train/loss", "train/loss_scale"));
    EXPECT_TRUE(metric_path_matches("moe/load/*", "moe/load/l03"));
    EXPECT_FALSE(metric_path_matches("moe/load/*", "moe/load"));
    EXPECT_FALSE(metric_path_matches("moe/load/*", "moe/load/l03/x"));
    EXPECT_TRUE(metric_path_matches("layer/*/grad_norm", "layer/12/grad_norm"));
    EXPECT_FALSE(metric_path_matches("layer/*/grad_norm", "layer/12/param_norm"));
    EXPECT_TRUE(metric_path_matches("*", "x"));
    EXPECT_FALSE(metric_path_matches("*", "x/y"));
}

TEST(MetricsSeries, BadQueriesNameTheParameter) {
    using mt::train::series_query_parse;
    auto message = [](const std::string& names, const std::string& since, const std::string& points) {
        try {
            series_query_parse(names, since, points);
        } catch (const mt::core::Error& e) {
            EXPECT_EQ(e.code(), mt::core::ExitCode::usage);
            return std::string(e.what());
        }
        return std::string("accepted");
    };
    EXPECT_TRUE(message("", "", "").starts_with("names:"));
    EXPECT_TRUE(message("train/loss,", "", "").starts_with("names:"));
    // Names are matched against the metric paths in memory, never opened: a file path is a name that matches nothing.
    EXPECT_EQ(message("../../etc/passwd", "", ""), "accepted");
    EXPECT_TRUE(message("train/loss;rm", "", "").starts_with("names:"));
    EXPECT_TRUE(message(std::string(200, 'a'), "", "").starts_with("names:"));
    std::string many;
    for (int i = 0; i < 65; ++i) many += fmt::format("{}a{}", i ? "," : "", i);
    EXPECT_TRUE(message(many, "", "").starts_with("names:"));
    EXPECT_TRUE(message("train/loss", "ten", "").starts_with("since:"));
    EXPECT_TRUE(message("train/loss", "1e3", "").starts_with("since:"));
    EXPECT_TRUE(message("train/loss", "", "1").starts_with("points:"));
    EXPECT_TRUE(message("train/loss", "", "100000").starts_with("points:"));
    const auto q = series_query_parse("train/loss,moe/load/*", "-5", "50");
    EXPECT_EQ(q.names, (std::vector<std::string>{"train/loss", "moe/load/*"}));
    EXPECT_EQ(q.since, -5);
    EXPECT_EQ(q.max_points, 50u);
}

// Steps the ring dropped come from the file; a restart's replayed steps replace the earlier values; thinning keeps the
// first and the last point.
TEST(MetricsSeries, RingFileRestartAndThinning) {
    const std::string path = fresh_dir("series") + "/metrics.jsonl";
    auto ring = std::make_shared<MetricsRing>(10, 4);
    {
        MetricsLog log(path);
        log.add_sink(ring);
        for (int64_t s = 1; s <= 50; ++s) log.write(s, "train", {{"loss", 1.0}, {"skipped", false}});
        for (int64_t s = 41; s <= 60; ++s) log.write(s, "train", {{"loss", 2.0}, {"skipped", true}});
        log.write(60, "eval", {{"val_loss", 3.0}});
    }
    const auto series = [&](const std::string& file, int64_t since, size_t points) {
        return mt::train::metrics_series(
            *ring, file, {.names = {"train/*", "eval/loss"}, .since = since, .max_points = points});
    };
    const json all = series(path, 0, 1000);
    const auto& loss = all["series"]["train/loss"];
    ASSERT_EQ(loss["steps"].size(), 60u);
    for (size_t i = 0; i < 60; ++i) {
        EXPECT_EQ(loss["steps"][i], static_cast<int64_t>(i) + 1);
        EXPECT_EQ(loss["values"][i], i < 40 ? 1.0 : 2.0) << i;
    }
    EXPECT_EQ(all["series"]["train/skipped"]["values"][59], 1);  // booleans as 0/1
    EXPECT_EQ(all["series"]["eval/loss"]["steps"], json({60}));
    EXPECT_EQ(all["last_step"], 60);
    // Without the file: the ring's 10 lines only.
    EXPECT_EQ(series("", 0, 1000)["series"]["train/loss"]["steps"].size(), 9u);  // steps 52..60 (+ the eval line)
    // Since a step the ring holds: no file read needed, and only newer steps.
    EXPECT_EQ(series(path, 58, 1000)["series"]["train/loss"]["steps"], json({58, 59, 60}));
    EXPECT_EQ(series(path, 61, 1000)["last_step"], nullptr);
    for (const size_t points : {2u, 3u, 7u, 59u}) {
        const auto thin = series(path, 0, points)["series"]["train/loss"]["steps"];
        EXPECT_LE(thin.size(), points);
        EXPECT_GE(thin.size(), std::min<size_t>(points, 2));
        EXPECT_EQ(thin.front(), 1);
        EXPECT_EQ(thin.back(), 60);
    }
}

TEST(MetricsSeries, EventsCarryTheirAlarmFlagAndTheCounters) {
    MetricsRing ring;
    ring.on_line(3, 1.5, "event", {{"event", "loss_spike"}, {"detail", "d"}});
    ring.on_line(4, 2.5, "event", {{"event", "resumed"}});
    const json e = mt::train::metrics_events(ring, 0);
    ASSERT_EQ(e["events"].size(), 2u);
    EXPECT_EQ(e["events"][0]["alarm"], true);
    EXPECT_EQ(e["events"][0]["step"], 3);
    EXPECT_EQ(e["events"][0]["time"], 1.5);
    EXPECT_EQ(e["events"][1]["alarm"], false);
    EXPECT_EQ(e["alarms"]["loss_spike"], 1);
    EXPECT_EQ(e["restarts"], 0);
    EXPECT_EQ(mt::train::metrics_events(ring, 4)["events"].size(), 1u);
}

}  // namespace
