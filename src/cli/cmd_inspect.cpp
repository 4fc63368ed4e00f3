// `moetrain inspect PATH`: lists the tensors (name, shape, dtype) of a checkpoint directory or a safetensors
// file, then prints the manifest. In a checkpoint each tensor also shows its sharding: the part of the global tensor
// it holds (the whole, a box at an offset, or a flat range), as the manifest records it.
#include <filesystem>
#include <map>

#include "cli/commands.h"
#include "train/checkpoint_io.h"

namespace mt::cli {

namespace {

// The manifest's region of each (file, key): "whole", "box at [o0, o1] of [g0, g1]" or "flat [b, e) of [g0, g1]".
using Regions = std::map<std::pair<std::string, std::string>, std::string>;
Regions manifest_regions(const nlohmann::json& manifest) {
    Regions regions;
    for (const auto& t : manifest.at("tensors")) {
        const auto global = t.value("global_shape", std::vector<int64_t>{});
        const auto shape = t.value("shape", std::vector<int64_t>{});
        std::string where = "whole";
        if (t.contains("flat_range")) {
            const auto range = t.at("flat_range").get<std::vector<int64_t>>();
            where = fmt::format("flat [{}, {}) of {}", range.at(0), range.at(1), core::shape_str(global));
        } else if (global != shape) {
            where = fmt::format(
                "box at {} of {}", core::shape_str(t.value("offset", std::vector<int64_t>{})), core::shape_str(global));
        }
        regions[{t.value("file", ""), t.value("key", "")}] = where;
    }
    return regions;
}

void print_tensors(const train::SafetensorsFile& file, const Regions& regions = {}, const std::string& name = "") {
    fmt::print("{}:\n", file.path());
    for (const auto& key : file.keys()) {
        const auto& info = file.info(key);
        const auto region = regions.find({name, key});
        fmt::print("  {:<48} {:<20} {:<5}{}\n",
                   key,
                   core::shape_str(info.shape),
                   info.dtype_name,
                   region == regions.end() ? "" : " " + region->second);
    }
}

}  // namespace

void register_inspect(CLI::App& app) {
    auto* cmd = app.add_subcommand("inspect", "list the tensors and the manifest of a checkpoint");
    auto path = std::make_shared<std::string>();
    auto verify = std::make_shared<bool>(false);
    cmd->add_option("path", *path, "checkpoint directory (step_XXXXXXXX) or .safetensors file")->required();
    cmd->add_flag("--verify", *verify, "also check every file's CRC-32C");
    cmd->callback([path, verify]() {
        if (!std::filesystem::is_directory(*path)) {
            const train::SafetensorsFile file(*path);
            print_tensors(file);
            // A lone safetensors file carries no checksum; its header and layout were checked on opening.
            if (*verify)
                fmt::print(
                    "verified: the header and data layout of {} ({} tensors); a file outside a checkpoint "
                    "has no recorded CRC-32C to check\n",
                    *path,
                    file.keys().size());
            return;
        }
        const train::Checkpoint ckpt = train::checkpoint_open(*path, *verify);
        const Regions regions = manifest_regions(ckpt.manifest());
        for (const auto& f : ckpt.manifest().at("files")) {
            const std::string name = f.at("name").get<std::string>();
            print_tensors(train::SafetensorsFile(*path + "/" + name), regions, name);
        }
        nlohmann::json manifest = ckpt.manifest();
        const size_t n = manifest["tensors"].size();
        manifest["tensors"] = fmt::format("<{} entries, listed above>", n);
        const std::string config = manifest.value("config_toml", "");
        manifest.erase("config_toml");
        fmt::print("manifest.json:\n{}\nconfig_toml:\n{}", manifest.dump(2), config);
        if (*verify) {
            uint64_t bytes = 0;
            for (const auto& f : ckpt.manifest().at("files")) bytes += f.at("bytes").get<uint64_t>();
            fmt::print(
                "verified: {} file(s), {} bytes: sizes and CRC-32C match manifest.json, and every tensor entry "
                "matches its file [{}]\n",
                ckpt.files_count(),
                bytes,
                *path);
        }
    });
}

}  // namespace mt::cli
