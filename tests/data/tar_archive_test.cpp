// Tar through libarchive (data/tar_archive.h): members written come back with their names, sizes and bytes; a
// member is read again from its header offset (also behind a pax long-name header); a file cut inside a member, inside
// a header or at a member boundary (no end-of-archive marker) is a truncated-shard error naming the file.
#include "data/tar_archive.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "core/file_util.h"
#include "data_test_util.h"

namespace mt::data {
namespace {

using core::ExitCode;
using testing::expect_error;
using testing::ScratchDir;

std::vector<uint8_t> bytes_of(const std::string& s) {
    return {s.begin(), s.end()};
}

const std::string kLong = std::string(150, 'd') + "/sample.txt";  // over ustar's 100 bytes: a pax header

std::vector<std::pair<std::string, std::vector<uint8_t>>> members() {
    return {{"a.txt", bytes_of("first")},
            {"dir/b.bin", std::vector<uint8_t>(3000, 7)},
            {"empty.txt", {}},
            {kLong, bytes_of("long name")}};
}

std::string write_tar(const ScratchDir& dir, const std::string& name) {
    TarWriter w(dir.file(name));
    for (const auto& [n, data] : members()) w.add(n, data);
    w.finish();
    return dir.file(name);
}

TEST(TarArchive, RoundTripAndRandomAccess) {
    ScratchDir dir;
    const std::string path = write_tar(dir, "x.tar");
    EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
    EXPECT_EQ(std::filesystem::file_size(path) % 512, 0u);
    TarReader reader(path);
    std::vector<TarMember> seen;
    TarMember m;
    for (const auto& [name, data] : members()) {
        ASSERT_TRUE(reader.next(&m));
        EXPECT_EQ(m.name, name);
        EXPECT_EQ(m.size, std::ssize(data));
        EXPECT_EQ(reader.read(), data);
        seen.push_back(m);
    }
    EXPECT_FALSE(reader.next(&m));
    // Backwards, each member from its own header offset.
    for (size_t i = seen.size(); i-- > 0;)
        EXPECT_EQ(tar_read_member(path, seen[i].header_offset, seen[i].name), members()[i].second) << seen[i].name;
    expect_error([&] { tar_read_member(path, seen[1].header_offset, "other"); }, ExitCode::data, {"no member"});
    // Reading a prefix.
    TarReader again(path);
    ASSERT_TRUE(again.next(&m));
    ASSERT_TRUE(again.next(&m));
    EXPECT_EQ(again.read(100).size(), 100u);
}

TEST(TarArchive, SameMembersGiveTheSameBytes) {
    ScratchDir dir;
    EXPECT_EQ(core::read_file(write_tar(dir, "1.tar"), ExitCode::data),
              core::read_file(write_tar(dir, "2.tar"), ExitCode::data));
}

TEST(TarArchive, TruncatedFilesAreNamed) {
    ScratchDir dir;
    const std::string path = write_tar(dir, "x.tar");
    const std::string bytes = core::read_file(path, ExitCode::data);
    auto scan = [](const std::string& p) {
        TarReader r(p);
        TarMember m;
        while (r.next(&m)) {
        }
    };
    // Inside b.bin's data (its header is at 1024, its data at 1536), inside its header, and right after its data (a
    // member boundary: libarchive alone would call that a clean end).
    for (const size_t cut : {size_t{2024}, size_t{1100}, size_t{1536 + 3072}}) {
        const std::string cut_path = dir.file("cut" + std::to_string(cut) + ".tar");
        testing::write_text(cut_path, bytes.substr(0, cut));
        expect_error([&] { scan(cut_path); }, ExitCode::data, {"truncated", cut_path});
    }
    testing::write_text(dir.file("notatar.tar"), "plain text, not a tar file at all\n");
    expect_error([&] { scan(dir.file("notatar.tar")); }, ExitCode::data, {"notatar.tar"});
    expect_error([&] { scan(dir.file("missing.tar")); }, ExitCode::data, {"missing.tar"});
}

}  // namespace
}  // namespace mt::data
