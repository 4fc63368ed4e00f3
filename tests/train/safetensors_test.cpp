// Tests for the atomic file utilities, CRC-32C/SHA-256 and the safetensors writer and validating reader.
#include "train/safetensors.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/crc32c.h"
#include "core/file_util.h"

using namespace mt;
using core::DType;
using core::ExitCode;
using core::Tensor;
namespace fs = std::filesystem;

namespace {

// A fresh scratch directory per test, removed afterwards.
class ScratchDir : public ::testing::Test {
   protected:
    void SetUp() override {
        const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
        dir_ = (fs::temp_directory_path() /
                fmt::format("mt_st_{}_{}_{}", ::getpid(), info->test_suite_name(), info->name()))
                   .string();
        fs::remove_all(dir_);
        fs::create_directories(dir_);
    }
    void TearDown() override {
        fs::remove_all(dir_);
    }
    std::string path(const std::string& name) const {
        return (fs::path(dir_) / name).string();
    }
    std::string dir_;
};

// Runs fn, expects an Error with the given code whose message contains every needle.
void expect_error(const std::function<void()>& fn, ExitCode code, const std::vector<std::string>& needles) {
    try {
        fn();
        ADD_FAILURE() << "no error thrown";
    } catch (const core::Error& e) {
        EXPECT_EQ(static_cast<int>(e.code()), static_cast<int>(code)) << e.what();
        for (const auto& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
    }
}

Tensor arange(const core::Shape& shape, DType dtype, double scale = 1.0) {
    Tensor t = Tensor::zeros(shape, dtype);
    for (int64_t i = 0; i < t.numel(); ++i) core::tensor_set_flat(t, i, (static_cast<double>(i) - 3.0) * scale);
    return t;
}

void expect_equal(const Tensor& a, const Tensor& b) {
    ASSERT_EQ(a.shape(), b.shape());
    for (int64_t i = 0; i < a.numel(); ++i) EXPECT_EQ(core::tensor_get_flat(a, i), core::tensor_get_flat(b, i)) << i;
}

// A raw safetensors file: header text padded to a multiple of 8, then buffer bytes.
void write_raw(const std::string& path, std::string header, size_t buffer_bytes) {
    header.append((8 - header.size() % 8) % 8, ' ');
    const uint64_t n = header.size();
    std::string bytes(reinterpret_cast<const char*>(&n), 8);
    bytes += header + std::string(buffer_bytes, '\0');
    core::write_file_atomic(path, bytes);
}

}  // namespace

TEST(CrcChecksums, CheckValueAndChaining) {
    EXPECT_EQ(core::crc32c("123456789", 9), 0xE3069283u);
    EXPECT_EQ(core::crc32c(nullptr, 0), 0u);
    std::string data(100003, '\0');
    for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 7 + (i >> 5));
    const uint32_t whole = core::crc32c(data.data(), data.size());
    for (size_t split : {size_t{0}, size_t{1}, size_t{7}, size_t{4096}, size_t{99999}})
        EXPECT_EQ(core::crc32c(data.data() + split, data.size() - split, core::crc32c(data.data(), split)), whole);
    EXPECT_EQ(core::crc32c_hex(0x1a2b3c4du), "1a2b3c4d");
}

// Long buffers go through three interleaved chains (lanes of 4096 bytes, combined by a fixed linear shift): any
// length and start, and any chaining split, must give the CRC of the plain bitwise definition.
TEST(CrcChecksums, InterleavedChainsEqualTheBitwiseDefinition) {
    auto bitwise = [](const uint8_t* p, size_t n) {
        uint32_t c = 0xFFFFFFFFu;
        for (size_t i = 0; i < n; ++i) {
            c ^= p[i];
            for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        }
        return ~c;
    };
    std::vector<uint8_t> data(3 * 3 * 4096 + 777);
    for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>((i * 2654435761u) >> 13);
    for (size_t start : {size_t{0}, size_t{3}, size_t{4096}})
        for (size_t n : {size_t{12287}, size_t{12288}, size_t{12289}, size_t{24576 + 5}, data.size() - 4096 - 3}) {
            if (start + n > data.size()) continue;
            SCOPED_TRACE(fmt::format("start {} n {}", start, n));
            const uint32_t want = bitwise(data.data() + start, n);
            EXPECT_EQ(core::crc32c(data.data() + start, n), want);
            EXPECT_EQ(core::crc32c(data.data() + start + 5000, n - 5000, core::crc32c(data.data() + start, 5000)),
                      want);
        }
}

// crc32c_combine joins the CRCs of two pieces without their bytes: for every split (empty pieces included, and
// lengths past 2^32 through the zero-byte identity) it must equal the CRC of the whole.
TEST(CrcChecksums, CombineEqualsTheCrcOfTheConcatenation) {
    std::string data(70001, '\0');
    for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>((i * 40503u) >> 7);
    const uint32_t whole = core::crc32c(data.data(), data.size());
    for (size_t split : {size_t{0}, size_t{1}, size_t{8}, size_t{12288}, size_t{33333}, size_t{70000}, size_t{70001}}) {
        const uint32_t a = core::crc32c(data.data(), split), b = core::crc32c(data.data() + split, data.size() - split);
        EXPECT_EQ(core::crc32c_combine(a, b, data.size() - split), whole) << "split " << split;
    }
    // Appending n zero bytes is combining with the CRC of n zeros.
    const std::string zeros(1 << 16, '\0');
    const uint32_t z = core::crc32c(zeros.data(), zeros.size());
    const uint32_t z2 = core::crc32c_combine(z, z, zeros.size());  // 2^17 zeros
    EXPECT_EQ(z2, core::crc32c(std::string(1 << 17, '\0').data(), 1 << 17));
    // Past 2^32: crc32c_combine(x, 0, n) multiplies x by x^(8 n), so doing it for n1, then n2, is doing it for n1 + n2.
    const uint64_t n1 = (uint64_t{1} << 33) + 12345, n2 = (uint64_t{1} << 40) + 777;
    EXPECT_EQ(core::crc32c_combine(core::crc32c_combine(whole, 0, n1), 0, n2), core::crc32c_combine(whole, 0, n1 + n2));
    EXPECT_NE(core::crc32c_combine(whole, 0, n1), core::crc32c_combine(whole, 0, n1 + 1));
    EXPECT_EQ(core::crc32c_combine(core::crc32c_combine(whole, z, zeros.size()), z, zeros.size()),
              core::crc32c_combine(whole, z2, size_t{1} << 17));
}

TEST(CrcChecksums, TensorBoardMaskedCrcGolden) {
    // conventions §7.3: the file_version record's length and payload CRCs.
    const uint8_t len[8] = {0x18, 0, 0, 0, 0, 0, 0, 0};
    EXPECT_EQ(core::masked_crc32c(core::crc32c(len, 8)), 0x224B7FA3u);
    const uint8_t payload[] = {0x09, 0,   0,   0,   0,   0,   0,   0xF0, 0x3F, 0x1A, 0x0D, 'b',
                               'r',  'a', 'i', 'n', '.', 'E', 'v', 'e',  'n',  't',  ':',  '2'};
    EXPECT_EQ(core::masked_crc32c(core::crc32c(payload, sizeof(payload))), 0x7A57BF86u);
}

TEST(CrcChecksums, Sha256StandardVectors) {
    EXPECT_EQ(core::sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    EXPECT_EQ(core::sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    EXPECT_EQ(core::sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
              "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    EXPECT_EQ(core::sha256_hex(std::string(1000000, 'a')),
              "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

using FileUtilAtomic = ScratchDir;

TEST_F(FileUtilAtomic, AtomicWriteAndRead) {
    core::write_file_atomic(path("a.txt"), std::string("hello"));
    EXPECT_EQ(core::read_file(path("a.txt")), "hello");
    core::write_file_atomic(path("a.txt"), std::string("second"));
    EXPECT_EQ(core::read_file(path("a.txt")), "second");
    EXPECT_EQ(core::file_size(path("a.txt")), 6u);
    EXPECT_EQ(core::file_crc32c(path("a.txt")), core::crc32c("second", 6));
    EXPECT_FALSE(fs::exists(path("a.txt.tmp")));
}

TEST_F(FileUtilAtomic, FailedWriteLeavesNoFile) {
    const std::string target = path("missing_dir/out.bin");
    expect_error([&] { core::write_file_atomic(target, std::string("x")); }, ExitCode::checkpoint, {target});
    EXPECT_FALSE(fs::exists(target));
    EXPECT_FALSE(fs::exists(target + ".tmp"));
    // The caller picks the exit code.
    expect_error([&] { core::write_file_atomic(target, std::string("x"), ExitCode::data); }, ExitCode::data, {target});
}

TEST_F(FileUtilAtomic, AbandonedWriterRemovesTmpAndKeepsOldFile) {
    core::write_file_atomic(path("f"), std::string("old"));
    {
        core::AtomicFileWriter w(path("f"));
        w.write(std::string("partial new content"));
        EXPECT_TRUE(fs::exists(path("f.tmp")));
    }
    EXPECT_FALSE(fs::exists(path("f.tmp")));
    EXPECT_EQ(core::read_file(path("f")), "old");
}

// The writer starts each full window's writeback and waits for the one before it (write_back): with a window of
// 4 KiB, writes of odd sizes that straddle many windows must still give the file and the CRC of the bytes.
TEST_F(FileUtilAtomic, WritesAcrossWritebackWindowsKeepEveryByte) {
    std::string expect;
    {
        core::AtomicFileWriter w(path("w.bin"), ExitCode::checkpoint, 4096);
        for (const size_t n : std::initializer_list<size_t>{1, 4095, 4096, 4097, 10000, 3, 8192, 12345}) {
            std::string piece(n, '\0');
            for (size_t i = 0; i < n; ++i) piece[i] = static_cast<char>((expect.size() + i) * 131 % 251);
            w.write(piece);
            expect += piece;
        }
        EXPECT_EQ(w.bytes(), expect.size());
        EXPECT_EQ(w.crc32c(), core::crc32c(expect.data(), expect.size()));
        w.commit();
    }
    EXPECT_EQ(core::read_file(path("w.bin")), expect);
    EXPECT_EQ(core::file_crc32c(path("w.bin")), core::crc32c(expect.data(), expect.size()));
    EXPECT_FALSE(fs::exists(path("w.bin.tmp")));
}

// file_crc32c reads pieces on the OpenMP threads and joins their CRCs: any piece size gives the CRC of the bytes.
TEST_F(FileUtilAtomic, FileCrcInPiecesEqualsTheCrcOfTheBytes) {
    std::string bytes(100003, '\0');
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>((i * 2246822519u) >> 11);
    core::write_file_atomic(path("c.bin"), bytes);
    const uint32_t want = core::crc32c(bytes.data(), bytes.size());
    for (const size_t piece : std::initializer_list<size_t>{1, 4097, 65536, 100003, size_t{64} << 20})
        EXPECT_EQ(core::file_crc32c(path("c.bin"), ExitCode::checkpoint, piece), want) << "pieces of " << piece;
    core::write_file_atomic(path("empty.bin"), std::string());
    EXPECT_EQ(core::file_crc32c(path("empty.bin")), 0u);
}

TEST_F(FileUtilAtomic, ReadMissingFileNamesIt) {
    expect_error([&] { core::read_file(path("nope")); }, ExitCode::checkpoint, {path("nope")});
    expect_error([&] { core::read_file(path("nope"), ExitCode::data); }, ExitCode::data, {path("nope")});
}

using SafetensorsIo = ScratchDir;

TEST_F(SafetensorsIo, RoundTripsDtypesAndMetadata) {
    const Tensor a = arange({3, 5}, DType::f32, 0.25), b = arange({7}, DType::f64, 1e-3),
                 c = arange({2, 3, 2}, DType::bf16, 0.5), d = arange({4}, DType::i32), e = arange({3}, DType::i64),
                 f = arange({0, 4}, DType::f32), g = arange({}, DType::f32);
    const auto res =
        train::safetensors_write(path("t.safetensors"),
                                 {{"a", a}, {"b", b}, {"c", c}, {"d", d}, {"e", e}, {"empty", f}, {"scalar", g}},
                                 {{"format", "pt"}, {"note", "x"}});
    EXPECT_EQ(res.bytes, core::file_size(path("t.safetensors")));
    EXPECT_EQ(res.crc32c, core::file_crc32c(path("t.safetensors")));

    const train::SafetensorsFile file(path("t.safetensors"));
    EXPECT_EQ(file.keys(), (std::vector<std::string>{"a", "b", "c", "d", "e", "empty", "scalar"}));
    EXPECT_EQ(file.metadata(), (std::map<std::string, std::string>{{"format", "pt"}, {"note", "x"}}));
    EXPECT_TRUE(file.has("c"));
    EXPECT_FALSE(file.has("z"));
    EXPECT_EQ(file.info("c").dtype_name, "BF16");
    EXPECT_EQ(file.info("c").shape, (core::Shape{2, 3, 2}));
    for (const auto& [name, t] : std::vector<std::pair<std::string, Tensor>>{
             {"a", a}, {"b", b}, {"c", c}, {"d", d}, {"e", e}, {"empty", f}, {"scalar", g}}) {
        const Tensor r = file.read(name);
        EXPECT_EQ(r.dtype(), t.dtype()) << name;
        expect_equal(r, t);
    }
    // Conversions: BF16 -> f32, F32 -> f64; same dtype into a strided view.
    const Tensor c32 = Tensor::zeros({2, 3, 2}, DType::f32);
    file.read_into("c", c32);
    expect_equal(c32, c.to(DType::f32));
    const Tensor a64 = Tensor::zeros({3, 5}, DType::f64);
    file.read_into("a", a64);
    expect_equal(a64, a);
    const Tensor big = Tensor::zeros({3, 8}, DType::f32);
    const Tensor view = big.slice(1, 2, 7);
    file.read_into("a", view);
    expect_equal(view.clone(), a);
    EXPECT_EQ(big.at({0, 0}), 0.0);
}

TEST_F(SafetensorsIo, ReadIntoChecksShapeAndDtypeFamily) {
    train::safetensors_write(path("t.safetensors"), {{"w", arange({2, 3}, DType::f32)}}, {});
    const train::SafetensorsFile file(path("t.safetensors"));
    expect_error(
        [&] {
            file.read_into("w", Tensor::zeros({3, 2}, DType::f32));
        },
        ExitCode::checkpoint,
        {"w", path("t.safetensors"), "[2, 3]", "[3, 2]"});
    expect_error([&] { file.read_into("w", Tensor::zeros({2, 3}, DType::i32)); }, ExitCode::checkpoint, {"w"});
    expect_error([&] { file.read("nope"); }, ExitCode::checkpoint, {"nope", path("t.safetensors")});
}

TEST_F(SafetensorsIo, ByteLayoutIsAlignedAndOrdered) {
    train::safetensors_write(path("t.safetensors"),
                             {{"z_i32", arange({3}, DType::i32)},
                              {"a_bf16", arange({3}, DType::bf16)},
                              {"m_f64", arange({1}, DType::f64)},
                              {"b_f32", arange({5}, DType::f32)},
                              {"a_f32", arange({1}, DType::f32)},
                              {"u8", arange({3}, DType::u8)}},
                             {{"k", "v"}});
    const std::string bytes = core::read_file(path("t.safetensors"));
    uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    EXPECT_EQ((8 + n) % 8, 0u);
    const std::string header = bytes.substr(8, n);
    EXPECT_EQ(header.front(), '{');
    EXPECT_EQ(header.find_last_not_of(' '), header.find_last_of('}'));
    const auto j = nlohmann::json::parse(header);
    const std::vector<std::pair<std::string, size_t>> expected = {
        {"m_f64", 8}, {"a_f32", 4}, {"b_f32", 4}, {"z_i32", 4}, {"a_bf16", 2}, {"u8", 1}};
    uint64_t pos = 0;
    for (const auto& [name, es] : expected) {
        const uint64_t begin = j[name]["data_offsets"][0], end = j[name]["data_offsets"][1];
        EXPECT_EQ(begin, pos) << name;
        EXPECT_EQ((8 + n + begin) % es, 0u) << name;
        pos = end;
    }
    EXPECT_EQ(8 + n + pos, bytes.size());
    EXPECT_EQ(j["__metadata__"]["k"], "v");
}

TEST_F(SafetensorsIo, WritesNonContiguousTensorsContiguous) {
    const Tensor base = arange({4, 6}, DType::i64);
    const Tensor strided = base.slice(1, 1, 5).slice(0, 1, 3);  // [2, 4], row stride 6
    ASSERT_FALSE(strided.is_contiguous());
    train::safetensors_write(path("t.safetensors"), {{"s", strided}, {"col", base.select(1, 2)}}, {});
    const train::SafetensorsFile file(path("t.safetensors"));
    expect_equal(file.read("s"), strided.clone());
    expect_equal(file.read("col"), base.select(1, 2).clone());
}

TEST_F(SafetensorsIo, FailedWriteLeavesNoFile) {
    const std::string target = path("no_such_dir/t.safetensors");
    expect_error(
        [&] {
            train::safetensors_write(target, {{"a", arange({2}, DType::f32)}}, {});
        },
        ExitCode::checkpoint,
        {target});
    EXPECT_FALSE(fs::exists(target));
    EXPECT_FALSE(fs::exists(target + ".tmp"));
}

TEST_F(SafetensorsIo, RejectsCorruptFiles) {
    const std::string f = path("bad.safetensors");
    const auto check = [&](const std::string& what) {
        SCOPED_TRACE(what);
        expect_error([&] { train::SafetensorsFile file(f); }, ExitCode::checkpoint, {f});
    };
    core::write_file_atomic(f, std::string("abc"));
    check("shorter than 8 bytes");
    uint64_t huge = 100000001;
    core::write_file_atomic(f, std::string(reinterpret_cast<const char*>(&huge), 8) + "{}      ");
    check("header over the limit");
    uint64_t beyond = 100;
    core::write_file_atomic(f, std::string(reinterpret_cast<const char*>(&beyond), 8) + "{}      ");
    check("header beyond the file");
    write_raw(f, "[1, 2]", 0);
    check("not an object");
    write_raw(f, "{\"a\": ", 0);
    check("invalid JSON");
    write_raw(f, R"({"a": {"dtype": "F7", "shape": [1], "data_offsets": [0, 4]}})", 4);
    check("unknown dtype");
    write_raw(f, R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}})", 4);
    check("shape does not match offsets");
    write_raw(f, R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", 4);
    check("offsets beyond the buffer");
    write_raw(f, R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})", 8);
    check("hole at the start");
    write_raw(f, R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", 8);
    check("hole at the end");
    write_raw(f,
              R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                  "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
              12);
    check("overlap");
    write_raw(f,
              R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                  "a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
              8);
    check("duplicate key");
    write_raw(f, R"({"__metadata__": {"x": 1}})", 0);
    check("metadata value not a string");
    write_raw(f, R"({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", 4);
    check("negative dim");
    write_raw(f, R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}})", 4);
    check("reversed offsets");
}

TEST_F(SafetensorsIo, MessagesNameTheTensorAndUseTheCallersCode) {
    const std::string f = path("bad.safetensors");
    write_raw(f, R"({"layer.w": {"dtype": "F7", "shape": [1], "data_offsets": [0, 4]}})", 4);
    expect_error([&] { train::SafetensorsFile file(f, ExitCode::data); }, ExitCode::data, {f, "layer.w", "F7"});
    write_raw(f, R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "a": {}})", 4);
    expect_error([&] { train::SafetensorsFile file(f); }, ExitCode::checkpoint, {f, "\"a\" twice"});
}

TEST_F(SafetensorsIo, AcceptsForeignDtypesButCannotLoadThem) {
    const std::string f = path("u64.safetensors");
    write_raw(f,
              R"({"r": {"dtype": "U64", "shape": [2], "data_offsets": [0, 16]},
                  "q": {"dtype": "F8_E4M3", "shape": [4], "data_offsets": [16, 20]}})",
              20);
    const train::SafetensorsFile file(f);
    EXPECT_FALSE(file.info("r").dtype_supported);
    EXPECT_EQ(file.info("q").element_size, 1u);
    expect_error([&] { file.read("r"); }, ExitCode::checkpoint, {"r", "U64", f});
}
