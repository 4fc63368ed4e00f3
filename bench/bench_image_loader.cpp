// Throughput of the image-text data path on the CPU (docs/data.md "Image-text data"): one JSON line per case.
//   bench_image_loader [--samples 256] [--sizes 336x336,448x448,448x336,512x384] [--seq 4096] [--rows 2]
//                      [--batches 20] [--step-ms 0,100,300] [--threads 1,2,4,8] [--formats png,jpeg] [--dir DIR]
//                      [--keep]
// Writes `samples` shapes images (data/shapes.h scenes rendered at the --sizes, cycled) with their captions as
// WebDataset shards, once as PNG and once as JPEG (quality 95), with the repo's writer (data/image_text_write.h)
// into a temporary folder (removed at the end unless --keep), then times per format:
//   case "decode": every image of the dataset read into memory, then decoded, resized to the vision limits
//     (112^2..448^2 pixels, sides multiples of 28; 512x384 is resized, the others keep their size) and patchified,
//     on this thread: images/s on one core, and the median milliseconds of each stage per image (read_ms: the
//     image's bytes from its shard, done before and not counted in images/s);
//   case "loader", per step time and per --threads count (data.loader_threads: the images of a batch prepared that
//     many at a time): the trainer's background loader (data/image_text_loader.h, 2 batches ahead) serving batches
//     of `rows` rows of `seq` tokens while the consumer sleeps `step_ms` per batch (a simulated GPU step): the
//     consumer's wait per batch, the time the trainer would stall, and idle_fraction = wait / (wait + step). The
//     first batch (nothing prefetched yet) is reported apart and left out of the wait statistics. fill_ms is the
//     mean of the same batches made synchronously first, and fill_images_per_s (also per thread) their images over
//     that time: the decode rate the loader can sustain.
#include <fmt/format.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "core/blas_kernels.h"
#include "core/error.h"
#include "data/image_codec.h"
#include "data/image_text_dataset.h"
#include "data/image_text_loader.h"
#include "data/image_text_rows.h"
#include "data/image_text_write.h"
#include "data/shapes.h"
#include "data/shapes_vocab.h"
#include "data/tokenizer.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using mt::data::ImageFormat;

double ms_since(Clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

std::vector<std::string> split(const std::string& list) {
    std::vector<std::string> out;
    size_t at = 0;
    while (at <= list.size()) {
        const size_t comma = std::min(list.find(',', at), list.size());
        if (comma > at) out.push_back(list.substr(at, comma - at));
        at = comma + 1;
    }
    return out;
}

std::vector<mt::data::ImageSize> parse_sizes(const std::string& list) {
    std::vector<mt::data::ImageSize> sizes;
    for (const std::string& item : split(list)) {
        const size_t x = item.find('x');
        MT_CHECK(x != std::string::npos, "--sizes: \"{}\" is not HxW", item);
        sizes.push_back({std::stoi(item.substr(0, x)), std::stoi(item.substr(x + 1))});
        MT_CHECK(sizes.back().height > 0 && sizes.back().width > 0, "--sizes: \"{}\" is empty", item);
    }
    MT_CHECK(!sizes.empty(), "--sizes names no size");
    return sizes;
}

// Writes the shards of one format; returns their paths.
std::vector<std::string> write_shards(const std::string& dir,
                                      ImageFormat format,
                                      int64_t samples,
                                      const std::vector<mt::data::ImageSize>& sizes) {
    const mt::data::ShapesDataset shapes{mt::data::ShapesOptions{}};
    mt::data::ImageTextWriteOptions o;
    o.out_dir = dir;
    o.prefix = mt::data::image_format_name(format);
    o.per_shard = 128;
    o.format = format;
    mt::data::ImageTextWriter writer(o);
    for (int64_t i = 0; i < samples; ++i) {
        const mt::data::ShapesSample s = shapes.sample(mt::data::ShapesSplit::train, static_cast<uint64_t>(i));
        const mt::data::ImageSize size = sizes[static_cast<size_t>(i) % sizes.size()];
        const mt::data::ShapesImage image = mt::data::shapes_render(s.scene, size.height, size.width);
        const std::span<const int32_t> words(s.text.data(), s.text.size() - 1);  // without <eos>
        writer.add_rgb(fmt::format("{:08d}", i), image.rgb, image.height, image.width, mt::data::shapes_decode(words));
    }
    return writer.finish().shards;
}

void bench_decode(const mt::data::ImageTextDataset& dataset, const std::string& format) {
    std::vector<std::vector<uint8_t>> bytes;
    std::vector<double> read_ms;
    int64_t total_bytes = 0;
    for (int64_t i = 0; i < dataset.size(); ++i) {
        const auto t0 = Clock::now();
        bytes.push_back(dataset.read_image(i));
        read_ms.push_back(ms_since(t0));
        total_bytes += std::ssize(bytes.back());
    }
    const mt::data::ImagePatchOptions patch;
    std::vector<double> decode_ms, resize_ms, patchify_ms;
    std::vector<float> patches;
    int64_t resized = 0;
    const auto t_all = Clock::now();
    for (const std::vector<uint8_t>& b : bytes) {
        auto t0 = Clock::now();
        const mt::data::DecodedImage img = mt::data::image_decode(b);
        decode_ms.push_back(ms_since(t0));
        t0 = Clock::now();
        const mt::data::ImageSize fit = mt::data::image_fit_size(img.height, img.width, 112 * 112, 448 * 448);
        const std::vector<uint8_t> rgb =
            mt::data::image_resize_bilinear(img.rgb.data(), img.height, img.width, fit.height, fit.width);
        resize_ms.push_back(ms_since(t0));
        resized += fit.height != img.height || fit.width != img.width;
        t0 = Clock::now();
        patches.resize(static_cast<size_t>(fit.height / patch.patch * (fit.width / patch.patch) *
                                           mt::data::image_patch_values(patch.patch)));
        mt::data::image_patchify(rgb.data(), fit.height, fit.width, patch, patches.data());
        patchify_ms.push_back(ms_since(t0));
    }
    const double all_ms = ms_since(t_all);
    const double n = static_cast<double>(bytes.size());
    const nlohmann::json line = {
        {"bench", "image_loader"},
        {"case", "decode"},
        {"format", format},
        {"threads", 1},
        {"images", bytes.size()},
        {"resized", resized},
        {"mean_file_bytes", static_cast<double>(total_bytes) / n},
        {"images_per_s_per_core", n / all_ms * 1e3},
        {"decode_images_per_s", n / std::accumulate(decode_ms.begin(), decode_ms.end(), 0.0) * 1e3},
        {"read_ms_median", median(read_ms)},
        {"decode_ms_median", median(decode_ms)},
        {"resize_ms_median", median(resize_ms)},
        {"patchify_ms_median", median(patchify_ms)}};
    std::printf("%s\n", line.dump().c_str());
    std::fflush(stdout);
}

void bench_loader(const mt::data::ImageTextDataset& dataset,
                  const std::string& format,
                  int64_t seq,
                  int64_t rows,
                  int64_t batches,
                  double step_ms,
                  int threads) {
    const mt::data::ByteTokenizer tokenizer;
    mt::data::ImageTextRowsOptions o;
    o.seq = seq;
    o.threads = threads;
    const mt::data::ImageTextRows data(dataset, tokenizer, o);
    mt::data::MultimodalBatch batch;
    // The synchronous cost of a batch, for scale: the decode rate at this thread count.
    const int64_t fills = batches;  // the batches the consumer takes below: here one batch may cost 2-3x another
    int64_t fill_images = 0;
    auto t0 = Clock::now();
    for (int64_t b = 0; b < fills; ++b) {
        data.fill(b * rows, rows, &batch);
        fill_images += std::ssize(batch.images.grids);
    }
    const double fill_all_ms = ms_since(t0), fill_ms = fill_all_ms / static_cast<double>(fills);
    const double fill_rate = static_cast<double>(fill_images) / fill_all_ms * 1e3;
    // As the trainer's: the loader is made with the data source, before the first step asks for a batch.
    mt::data::ImageTextLoader loader(
        [&data](int64_t first_row, int64_t n, mt::data::MultimodalBatch* out) { data.fill(first_row, n, out); });
    std::vector<double> waits;
    double first_ms = 0;
    int64_t images = 0;
    const auto t_all = Clock::now();
    for (int64_t b = 0; b < batches; ++b) {
        t0 = Clock::now();
        loader.get(b * rows, rows, &batch);
        const double wait = ms_since(t0);
        if (b == 0)
            first_ms = wait;
        else
            waits.push_back(wait);
        images += std::ssize(batch.images.grids);
        if (step_ms > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(step_ms));
    }
    const double all_ms = ms_since(t_all);
    const double wait_sum = std::accumulate(waits.begin(), waits.end(), 0.0);
    const double wait_mean = waits.empty() ? 0.0 : wait_sum / static_cast<double>(waits.size());
    const nlohmann::json line = {{"bench", "image_loader"},
                                 {"case", "loader"},
                                 {"format", format},
                                 {"seq", seq},
                                 {"rows", rows},
                                 {"threads", threads},
                                 {"batches", batches},
                                 {"images_per_batch", static_cast<double>(images) / static_cast<double>(batches)},
                                 {"step_ms", step_ms},
                                 {"fill_ms", fill_ms},
                                 {"fill_images_per_s", fill_rate},
                                 {"fill_images_per_s_per_thread", fill_rate / threads},
                                 {"first_wait_ms", first_ms},
                                 {"wait_ms_mean", wait_mean},
                                 {"wait_ms_median", median(waits)},
                                 {"wait_ms_max", waits.empty() ? 0.0 : *std::max_element(waits.begin(), waits.end())},
                                 {"idle_fraction", wait_mean + step_ms > 0 ? wait_mean / (wait_mean + step_ms) : 0.0},
                                 {"images_per_s", static_cast<double>(images) / all_ms * 1e3},
                                 {"served_prefetched", loader.served_prefetched()},
                                 {"served_inline", loader.served_inline()}};
    std::printf("%s\n", line.dump().c_str());
    std::fflush(stdout);
}

int run(int argc, char** argv) {
    CLI::App app{"moetrain image-text loader benchmark (CPU)"};
    int64_t samples = 256, seq = 4096, rows = 2, batches = 20;
    std::string sizes = "336x336,448x448,448x336,512x384", steps = "0,100,300", threads = "1,2,4,8",
                formats = "png,jpeg", dir;
    bool keep = false;
    app.add_option("--samples", samples, "images written per format")->check(CLI::PositiveNumber);
    app.add_option("--sizes", sizes, "image sizes in pixels, HxW, comma-separated, cycled");
    app.add_option("--seq", seq, "tokens per row");
    app.add_option("--rows", rows, "rows per batch")->check(CLI::PositiveNumber);
    app.add_option("--batches", batches, "batches the consumer takes per loader case")->check(CLI::PositiveNumber);
    app.add_option("--step-ms", steps, "simulated step times, milliseconds, comma-separated: one loader case each");
    app.add_option("--threads", threads, "data.loader_threads values, comma-separated: one loader case each per step");
    app.add_option("--formats", formats, "png, jpeg or both");
    app.add_option("--dir", dir, "where to write the shards (default: a new folder under the temp dir)");
    app.add_flag("--keep", keep, "keep the shards");
    CLI11_PARSE(app, argc, argv);
    const bool own_dir = dir.empty();
    if (own_dir) dir = fs::temp_directory_path() / ("mt_bench_image_loader_" + std::to_string(getpid()));
    fs::create_directories(dir);
    const std::vector<mt::data::ImageSize> size_list = parse_sizes(sizes);
    for (const std::string& format : split(formats)) {
        const ImageFormat f = format == "png"    ? ImageFormat::png
                              : format == "jpeg" ? ImageFormat::jpeg
                                                 : ImageFormat::unknown;
        MT_CHECK(f != ImageFormat::unknown, "--formats: \"{}\" is neither png nor jpeg", format);
        const auto t0 = Clock::now();
        const std::vector<std::string> shards = write_shards(dir, f, samples, size_list);
        std::fprintf(stderr,
                     "bench_image_loader: wrote %lld %s samples in %.1f s\n",
                     static_cast<long long>(samples),
                     format.c_str(),
                     ms_since(t0) / 1e3);
        const mt::data::ImageTextDataset dataset("webdataset", shards, {.log = false});
        bench_decode(dataset, format);
        for (const std::string& t : split(threads)) {
            const int n = std::stoi(t);
            MT_CHECK(n >= 1, "--threads: {} must be >= 1", n);
            for (const std::string& s : split(steps))
                bench_loader(dataset, format, seq, rows, batches, std::stod(s), n);
        }
    }
    if (own_dir && !keep) fs::remove_all(dir);
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    mt::core::blas_select_kernels(argv);
    try {
        return run(argc, argv);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_image_loader: error: %s\n", e.what());
        return 1;
    }
}
