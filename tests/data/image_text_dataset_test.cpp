// Image-caption data on disk (data/image_text_dataset.h, data/image_text_write.h): shapes samples written as
// WebDataset shards and as a JSONL manifest read back with the same captions and, for PNG, the same pixels; a folder
// of images with captions becomes shards; every bad sample (corrupt image, missing caption, two images, bad JSON
// caption, truncated shard, malformed manifest line, missing image file) is exit 3 naming the file and the sample, or
// skipped and counted with data.skip_bad_samples.
#include "data/image_text_dataset.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "core/file_util.h"
#include "data/image_codec.h"
#include "data/image_text_write.h"
#include "data/shapes_vocab.h"
#include "data/tar_archive.h"
#include "data_test_util.h"

namespace mt::data {
namespace {

using core::ExitCode;
using testing::expect_error;
using testing::quiet;
using testing::ScratchDir;

std::vector<uint8_t> bytes_of(const std::string& s) {
    return {s.begin(), s.end()};
}

std::vector<uint8_t> small_png(int h = 30, int w = 40, uint8_t value = 90) {
    return image_encode_png(std::vector<uint8_t>(static_cast<size_t>(h * w * 3), value), h, w);
}

TEST(ImageTextDataset, ShapesShardsAndManifestRoundTrip) {
    ScratchDir dir;
    ShapesOptions shapes;
    shapes.seed = 5;
    ImageTextWriteOptions o;
    o.out_dir = dir.file("out");
    o.per_shard = 2;
    o.manifest = true;
    const ImageTextWriteResult r = image_text_write_shapes(shapes, ShapesSplit::train, 5, o);
    ASSERT_EQ(r.shards.size(), 3u);
    EXPECT_EQ(r.samples, 5);
    const ImageTextDataset tar("webdataset", r.shards, quiet());
    const ImageTextDataset jsonl("image_jsonl", {r.manifest}, quiet());
    ASSERT_EQ(tar.size(), 5);
    ASSERT_EQ(jsonl.size(), 5);
    const ShapesDataset dataset(shapes);
    for (int64_t i = 0; i < 5; ++i) {
        const ShapesSample s = dataset.sample(ShapesSplit::train, static_cast<uint64_t>(i));
        const ShapesImage image = shapes_render(s.scene);
        const std::string caption = shapes_decode(std::span(s.text.data(), s.text.size() - 1));
        for (const ImageTextDataset* d : {&tar, &jsonl}) {
            EXPECT_EQ(d->sample(i).caption, caption);
            EXPECT_EQ(d->sample(i).size, (ImageSize{image.height, image.width}));
            const DecodedImage back = image_decode(d->read_image(i));
            EXPECT_EQ(back.rgb, image.rgb) << "sample " << i << " of " << d->format();
        }
        EXPECT_EQ(tar.sample(i).key, fmt::format("{:08d}", i));
        EXPECT_EQ(tar.where(i), fmt::format("[{}, sample \"{:08d}\"]", r.shards[i / 2], i));
        EXPECT_EQ(jsonl.where(i), fmt::format("[{} line {}, image \"train/{:08d}.png\"]", r.manifest, i + 1, i));
    }
    EXPECT_TRUE(tar.sample(0).caption.ends_with(" ."));  // words, without <eos>
}

TEST(ImageTextDataset, JsonCaptionsKeysAndIgnoredMembers) {
    ScratchDir dir;
    TarWriter w(dir.file("s.tar"));
    w.add("x/one.seg.png", small_png());  // key x/one; extension seg.png is not an image member
    w.add("x/one.jpg", image_encode_jpeg(std::vector<uint8_t>(28 * 28 * 3, 50), 28, 28));
    w.add("x/one.json", bytes_of(R"({"caption": "from json", "text": "not this"})"));
    w.add("x/one.cls", bytes_of("3"));
    w.add("two.png", small_png());
    w.add("two.txt", bytes_of("trailing space \n\n"));
    w.add("two.json", bytes_of(R"({"text": "ignored: the .txt wins"})"));
    w.add("three.PNG", small_png());
    w.add("three.json", bytes_of(R"({"text": "text field"})"));
    w.finish();
    const ImageTextDataset d("webdataset", {dir.file("s.tar")}, quiet());
    ASSERT_EQ(d.size(), 3);
    EXPECT_EQ(d.sample(0).key, "x/one");
    EXPECT_EQ(d.sample(0).image, "x/one.jpg");
    EXPECT_EQ(d.sample(0).caption, "from json");
    EXPECT_EQ(d.sample(1).caption, "trailing space");
    EXPECT_EQ(d.sample(2).caption, "text field");
    EXPECT_EQ(d.sample(0).size, (ImageSize{28, 28}));
}

TEST(ImageTextDataset, FolderOfImagesBecomesShards) {
    ScratchDir dir;
    std::filesystem::create_directories(dir.file("in"));
    const std::vector<uint8_t> a = small_png(), b = image_encode_jpeg(std::vector<uint8_t>(28 * 56 * 3, 9), 28, 56);
    core::write_file_atomic(dir.file("in/a.png"), a.data(), a.size(), ExitCode::data);
    core::write_file_atomic(dir.file("in/b.v2.jpg"), b.data(), b.size(), ExitCode::data);
    testing::write_text(dir.file("in/a.txt"), "a caption\n");
    testing::write_text(dir.file("in/b.v2.txt"), "b caption");
    testing::write_text(dir.file("in/notes.md"), "not an image");
    ImageTextWriteOptions o;
    o.out_dir = dir.file("out");
    const ImageTextWriteResult r = image_text_write_folder(dir.file("in"), o);
    ASSERT_EQ(r.shards, std::vector<std::string>{dir.file("out/train-000000.tar")});
    const ImageTextDataset d("webdataset", r.shards, quiet());
    ASSERT_EQ(d.size(), 2);
    EXPECT_EQ(d.sample(0).caption, "a caption");
    EXPECT_EQ(d.sample(1).key, "b_v2");
    EXPECT_EQ(d.read_image(0), a);  // bytes kept as they are
    EXPECT_EQ(d.read_image(1), b);
    std::filesystem::remove(dir.file("in/a.txt"));
    o.out_dir = dir.file("out2");
    expect_error(
        [&] { image_text_write_folder(dir.file("in"), o); }, ExitCode::data, {"missing caption a.txt", "a.png"});
    EXPECT_FALSE(std::filesystem::exists(dir.file("out2/train-000000.tar")));
}

// A shard whose samples are: 0 good, 1 corrupt image, 2 no caption, 3 two images, 4 bad JSON caption, 5 no image,
// 6 good.
std::string bad_shard(const ScratchDir& dir) {
    TarWriter w(dir.file("bad.tar"));
    w.add("000.png", small_png());
    w.add("000.txt", bytes_of("good zero"));
    w.add("001.png", bytes_of("this is not a png"));
    w.add("001.txt", bytes_of("corrupt image"));
    w.add("002.png", small_png());
    w.add("003.png", small_png());
    w.add("003.jpg", small_png());
    w.add("003.txt", bytes_of("two images"));
    w.add("004.png", small_png());
    w.add("004.json", bytes_of("{\"caption\": 7}"));
    w.add("005.txt", bytes_of("no image"));
    w.add("006.png", small_png());
    w.add("006.txt", bytes_of("good six"));
    w.finish();
    return dir.file("bad.tar");
}

TEST(ImageTextDataset, BadTarSamplesStopOrAreSkippedAndCounted) {
    ScratchDir dir;
    const std::string shard = bad_shard(dir);
    expect_error([&] { ImageTextDataset("webdataset", {shard}, quiet()); },
                 ExitCode::data,
                 {"corrupt image 001.png: not a PNG or JPEG image", fmt::format("[{}, sample \"001\"]", shard)});
    const ImageTextDataset d("webdataset", {shard}, quiet(true));
    ASSERT_EQ(d.size(), 2);
    EXPECT_EQ(d.sample(0).caption, "good zero");
    EXPECT_EQ(d.sample(1).caption, "good six");
    EXPECT_EQ(d.skipped(), 5);

    // Each bad kind alone, without skipping: the message says what and where.
    auto only = [&](const std::vector<std::pair<std::string, std::vector<uint8_t>>>& members) {
        TarWriter w(dir.file("one.tar"));
        for (const auto& [n, data] : members) w.add(n, data);
        w.finish();
        ImageTextDataset("webdataset", {dir.file("one.tar")}, quiet());
    };
    const std::string where = image_text_where_tar(dir.file("one.tar"), "k");
    expect_error([&] { only({{"k.png", small_png()}}); }, ExitCode::data, {"missing caption", where});
    expect_error(
        [&] {
            only({{"k.png", small_png()}, {"k.jpg", small_png()}, {"k.txt", bytes_of("c")}});
        },
        ExitCode::data,
        {"two images in one sample (k.png, k.jpg)", where});
    expect_error(
        [&] {
            only({{"k.png", small_png()}, {"k.json", bytes_of("{\"caption\": 7}")}});
        },
        ExitCode::data,
        {"no \"caption\" or \"text\" string", where});
    expect_error(
        [&] {
            only({{"k.png", small_png()}, {"k.json", bytes_of("{oops")}});
        },
        ExitCode::data,
        {"not a JSON object", where});
    expect_error([&] { only({{"k.txt", bytes_of("c")}}); }, ExitCode::data, {"no image", where});
}

TEST(ImageTextDataset, TruncatedShardNamesTheSampleAndKeepsTheOnesBefore) {
    ScratchDir dir;
    TarWriter w(dir.file("full.tar"));
    for (int i = 0; i < 4; ++i) {
        w.add(fmt::format("{:03d}.png", i), small_png(60, 60, static_cast<uint8_t>(i)));
        w.add(fmt::format("{:03d}.txt", i), bytes_of("caption " + std::to_string(i)));
    }
    w.finish();
    const std::string bytes = core::read_file(dir.file("full.tar"), ExitCode::data);
    TarReader reader(dir.file("full.tar"));
    TarMember m;
    for (int i = 0; i < 5; ++i) ASSERT_TRUE(reader.next(&m));  // 002.png
    const std::string cut = dir.file("cut.tar");
    testing::write_text(cut, bytes.substr(0, static_cast<size_t>(m.header_offset + 512 + m.size / 2)));
    expect_error([&] { ImageTextDataset("webdataset", {cut}, quiet()); },
                 ExitCode::data,
                 {"truncated", image_text_where_tar(cut, "002")});
    const ImageTextDataset d("webdataset", {cut}, quiet(true));
    EXPECT_EQ(d.size(), 2);
    EXPECT_EQ(d.skipped(), 1);
}

TEST(ImageTextDataset, BadManifestLinesStopOrAreSkipped) {
    ScratchDir dir;
    const std::vector<uint8_t> png = small_png();
    std::filesystem::create_directories(dir.file("img"));
    core::write_file_atomic(dir.file("img/a.png"), png.data(), png.size(), ExitCode::data);
    core::write_file_atomic(dir.file("img/bad.png"), "garbage!", 8, ExitCode::data);
    const std::string manifest = dir.file("m.jsonl");
    testing::write_text(manifest,
                        "{\"image\": \"img/a.png\", \"text\": \"relative\"}\n"
                        "\n"
                        "{\"image\": \"" +
                            dir.file("img/a.png") +
                            "\", \"caption\": \"absolute\"}\n"
                            "{\"image\": \"img/a.png\", \"text\": \n"
                            "{\"image\": \"img/missing.png\", \"text\": \"x\"}\n"
                            "{\"image\": \"img/bad.png\", \"text\": \"x\"}\n"
                            "{\"image\": \"img/a.png\"}\n"
                            "[1, 2]\n");
    const ImageTextDataset d("image_jsonl", {manifest}, quiet(true));
    ASSERT_EQ(d.size(), 2);
    EXPECT_EQ(d.sample(0).caption, "relative");
    EXPECT_EQ(d.sample(1).caption, "absolute");
    EXPECT_EQ(d.sample(1).line, 3);
    EXPECT_EQ(d.skipped(), 5);
    EXPECT_EQ(d.read_image(0), png);
    auto line = [&](const std::string& text) {
        testing::write_text(dir.file("one.jsonl"), text + "\n");
        ImageTextDataset("image_jsonl", {dir.file("one.jsonl")}, quiet());
    };
    const std::string one = dir.file("one.jsonl");
    expect_error([&] { line("{\"image\": \"img/a.png\", \"text\": "); },
                 ExitCode::data,
                 {"malformed manifest line", fmt::format("[{} line 1]", one)});
    expect_error([&] { line("{\"image\": \"img/missing.png\", \"text\": \"x\"}"); },
                 ExitCode::data,
                 {"bad image", "missing.png", fmt::format("[{} line 1, image \"img/missing.png\"]", one)});
    expect_error([&] { line("{\"image\": \"img/bad.png\", \"text\": \"x\"}"); },
                 ExitCode::data,
                 {"not a PNG or JPEG", "line 1, image \"img/bad.png\""});
    expect_error([&] { line("{\"image\": \"img/a.png\"}"); }, ExitCode::data, {"missing caption", "line 1"});
    expect_error([&] { line(""); }, ExitCode::data, {"no image-caption sample"});
}

TEST(ImageTextDataset, SplitsNames) {
    std::string key, ext;
    image_text_split_name("a/b.c/d.seg.PNG", &key, &ext);
    EXPECT_EQ(key, "a/b.c/d");
    EXPECT_EQ(ext, "seg.png");
    image_text_split_name("noext", &key, &ext);
    EXPECT_EQ(key, "noext");
    EXPECT_EQ(ext, "");
}

}  // namespace
}  // namespace mt::data
