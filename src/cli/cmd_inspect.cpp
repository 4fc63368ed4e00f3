// `moetrain inspect PATH`: lists the tensors (name, shape, dtype) of a checkpoint directory or a safetensors
// file, then prints the manifest.
#include <filesystem>

#include "cli/commands.h"
#include "train/checkpoint_io.h"

namespace mt::cli {

namespace {

void print_tensors(const train::SafetensorsFile& file) {
    fmt::print("{}:\n", file.path());
    for (const auto& key : file.keys()) {
        const auto& info = file.info(key);
        fmt::print("  {:<48} {:<20} {}\n", key, core::shape_str(info.shape), info.dtype_name);
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
        for (const auto& f : ckpt.manifest().at("files"))
            print_tensors(train::SafetensorsFile(*path + "/" + f.at("name").get<std::string>()));
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
