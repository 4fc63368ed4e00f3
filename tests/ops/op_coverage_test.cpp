// CI rule of conventions §1.4: every op header in src/ops/ has at least one registered harness case, and every
// registered op name is a header.
#include <gtest/gtest.h>

#include <filesystem>

#include "op_harness.h"

namespace mt::ops::test {
namespace {

TEST(OpCoverage, EveryHeaderHasCases) {
    const std::filesystem::path dir = std::filesystem::path(MT_SOURCE_DIR) / "src" / "ops";
    ASSERT_TRUE(std::filesystem::is_directory(dir)) << dir;
    const std::set<std::string> registered = op_registered_ops();
    std::set<std::string> headers;
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
        if (entry.path().extension() != ".h" || entry.path().filename() == "op_common.h") continue;
        const std::string op = entry.path().stem().string();
        headers.insert(op);
        EXPECT_TRUE(registered.count(op)) << "src/ops/" << op << ".h has no registered case in tests/ops/";
    }
    EXPECT_GE(headers.size(), 10u);
    for (const std::string& op : registered)
        EXPECT_TRUE(headers.count(op)) << "cases are registered for \"" << op << "\" but src/ops/" << op
                                       << ".h does not exist";
}

}  // namespace
}  // namespace mt::ops::test
