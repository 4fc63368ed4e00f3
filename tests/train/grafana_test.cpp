// tools/grafana/moetrain.json: valid JSON with a Prometheus datasource variable that every panel uses, the panels the
// issue lists, and every metric family its expressions name produced by the endpoint's /metrics for a tiny MoE
// training (a few families that moetrain does not log yet are listed, and must still be missing: the list shrinks
// when they come).
#include <gtest/gtest.h>
#include <httplib.h>

#include <regex>
#include <set>

#include "core/file_util.h"
#include "support/http_raw.h"
#include "support/prometheus_parser.h"
#include "support/tiny_job.h"
#include "train/trainer.h"

namespace {

using nlohmann::json;

// Families a panel may name before moetrain logs them: train/mfu comes with the metric registry (issue 27 item 6).
const std::set<std::string> kNotLoggedYet = {"moetrain_train_mfu"};

std::set<std::string> families_named(const std::string& expr) {
    static const std::regex family("moetrain_[a-zA-Z0-9_:]*");
    std::set<std::string> out;
    for (auto it = std::sregex_iterator(expr.begin(), expr.end(), family); it != std::sregex_iterator(); ++it)
        out.insert(it->str());
    return out;
}

// The families of /metrics after a tiny MoE training with per-expert series, an evaluation and the event counters.
std::set<std::string> produced_families() {
    const std::string dir = mt::testing::fresh_dir("run");
    const int port = mt::testing::http_free_port();
    mt::train::Trainer trainer(
        mt::testing::tiny_job(dir,
                              mt::testing::tiny_moe_overrides({"train.steps=2",
                                                               "train.eval_every=2",
                                                               "moe.log_loads_every=1",
                                                               "metrics.prometheus_per_expert=true",
                                                               fmt::format("metrics.port={}", port)})),
        false);
    trainer.run();
    httplib::Client client("127.0.0.1", port);
    const auto res = client.Get("/metrics");
    EXPECT_TRUE(res && res->status == 200);
    std::set<std::string> out;
    if (res)
        for (const auto& f : mt::testing::prometheus_parse(res->body).families) out.insert(f.name);
    return out;
}

TEST(Grafana, DashboardJsonNamesOnlyFamiliesTheEndpointServes) {
    const json dash = json::parse(mt::core::read_file(std::string(MT_SOURCE_DIR) + "/tools/grafana/moetrain.json"));
    const auto& variables = dash.at("templating").at("list");
    const auto datasource = std::find_if(
        variables.begin(), variables.end(), [](const json& v) { return v.value("type", "") == "datasource"; });
    ASSERT_NE(datasource, variables.end());
    EXPECT_EQ(datasource->at("query"), "prometheus");
    const std::string uid = "${" + datasource->at("name").get<std::string>() + "}";

    std::set<std::string> named, titles;
    std::set<int> ids;
    for (const json& v : variables)
        if (v.contains("definition")) named.merge(families_named(v.at("definition").get<std::string>()));
    for (const json& panel : dash.at("panels")) {
        const std::string title = panel.at("title");
        titles.insert(title);
        EXPECT_TRUE(ids.insert(panel.at("id").get<int>()).second) << "duplicate panel id in " << title;
        EXPECT_EQ(panel.at("datasource").at("type"), "prometheus") << title;
        EXPECT_EQ(panel.at("datasource").at("uid"), uid) << title;
        ASSERT_FALSE(panel.at("targets").empty()) << title;
        for (const json& target : panel.at("targets")) {
            const std::set<std::string> families = families_named(target.at("expr").get<std::string>());
            EXPECT_FALSE(families.empty()) << title << ": " << target.at("expr");
            named.insert(families.begin(), families.end());
        }
    }
    for (const char* want : {"Loss",
                             "Learning rate",
                             "Gradient norm",
                             "Tokens per second",
                             "MFU",
                             "Memory",
                             "Alarms in the time range",
                             "Restarts",
                             "Expert load per layer and expert"})
        EXPECT_TRUE(titles.contains(want)) << "no panel " << want;

    const std::set<std::string> produced = produced_families();
    for (const std::string& family : named) {
        if (kNotLoggedYet.contains(family)) {
            EXPECT_FALSE(produced.contains(family)) << family << " is logged now: take it off kNotLoggedYet";
            continue;
        }
        EXPECT_TRUE(produced.contains(family)) << "a panel names " << family << ", which /metrics does not serve";
    }
}

}  // namespace
