// Writing a checkpoint directory (conventions §5.2): the temp directory, each rank's safetensors file, then rank 0's
// manifest, DONE and the rename into place, and retention. The three phases are separate functions so that the
// middle one, the only slow one, can run on a background thread (train/async_checkpoint.h) while the first and the
// last, which talk to the other ranks, stay on the training thread.
#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <map>

#include "core/crc32c.h"
#include "core/file_util.h"
#include "parallel/comm.h"
#include "train/checkpoint_io.h"

#ifndef MT_VERSION
#define MT_VERSION "unknown"
#endif

namespace mt::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string final_dir_of(const std::string& checkpoints_root, int64_t step) {
    return (fs::path(checkpoints_root) / checkpoint_dir_name(step)).string();
}

// The fields checkpoint_finish writes itself may not come from the caller.
void check_manifest_extra(const json& manifest_extra) {
    MT_CHECK(manifest_extra.is_object() || manifest_extra.is_null(), "checkpoint_write: manifest_extra not an object");
    for (const char* field : {"format", "version", "step", "moetrain_version", "created_unix", "files", "tensors"})
        MT_CHECK(!manifest_extra.contains(field), "checkpoint_write: manifest_extra sets the reserved field {}", field);
}

}  // namespace

std::string checkpoint_begin(const std::string& checkpoints_root, int64_t step, parallel::Comm* comm) {
    MT_CHECK(step >= 0, "checkpoint_begin: negative step {}", step);
    const std::string tmp_dir = final_dir_of(checkpoints_root, step) + ".tmp";
    if (comm == nullptr || comm->rank() == 0) {
        std::error_code ec;
        fs::create_directories(checkpoints_root, ec);
        checkpoint_check_fs(ec, "create the checkpoint directory", checkpoints_root);
        fs::remove_all(tmp_dir, ec);
        if (!ec) fs::create_directory(tmp_dir, ec);
        checkpoint_check_fs(ec, "create the directory", tmp_dir);
    }
    if (comm != nullptr && comm->size() > 1) comm->barrier();
    return tmp_dir;
}

json checkpoint_write_rank_file(const std::string& tmp_dir, int rank, const std::vector<CheckpointTensor>& tensors) {
    // One key per region: "kind/name", and "kind/name#k" for the k-th further region of the same tensor in this
    // file (a ZeRO-1 range of a tp-split shard is up to three boxes of the global tensor; the manifest names each
    // region's key, so readers never build keys themselves).
    std::vector<std::pair<std::string, core::Tensor>> items;
    std::map<std::string, int> regions_of;
    items.reserve(tensors.size());
    for (const auto& t : tensors) {
        MT_CHECK(!t.name.empty() && !t.kind.empty() && t.kind.find('/') == std::string::npos,
                 "checkpoint_write: bad tensor name or kind ({}, {})",
                 t.kind,
                 t.name);
        const std::string key = t.kind + "/" + t.name;
        const int k = regions_of[key]++;
        items.emplace_back(k == 0 ? key : fmt::format("{}#{}", key, k), t.tensor);
    }
    const std::string rank_file = fmt::format("rank_{:05d}.safetensors", rank);
    const SafetensorsWriteResult written = safetensors_write(
        (fs::path(tmp_dir) / rank_file).string(), items, {{"format", "moetrain-shard"}, {"version", "1"}});
    json part = {
        {"file", {{"name", rank_file}, {"bytes", written.bytes}, {"crc32c", core::crc32c_hex(written.crc32c)}}},
        {"tensors", json::array()}};
    for (size_t i = 0; i < tensors.size(); ++i) {
        const CheckpointTensor& t = tensors[i];
        const core::Shape global = t.global_shape.empty() ? t.tensor.shape() : t.global_shape;
        json e = {{"name", t.name},
                  {"kind", t.kind},
                  {"dtype", std::string(core::dtype_safetensors_name(t.tensor.dtype()))},
                  {"global_shape", global},
                  {"file", rank_file},
                  {"key", items[i].first}};
        if (t.flat_begin >= 0) {
            e["flat_range"] = {t.flat_begin, t.flat_begin + t.tensor.numel()};
        } else {
            e["offset"] = t.offset.empty() ? core::Shape(global.size(), 0) : t.offset;
            e["shape"] = t.tensor.shape();
        }
        part["tensors"].push_back(std::move(e));
    }
    return part;
}

std::string checkpoint_finish(const std::string& checkpoints_root,
                              int64_t step,
                              const json& part,
                              const json& manifest_extra,
                              const RetentionPolicy& keep,
                              parallel::Comm* comm) {
    check_manifest_extra(manifest_extra);
    const bool multi = comm != nullptr && comm->size() > 1;
    const std::string final_dir = final_dir_of(checkpoints_root, step), tmp_dir = final_dir + ".tmp";
    const std::vector<std::string> parts =
        multi ? parallel::comm_gather_strings(*comm, part.dump(), 0) : std::vector<std::string>{part.dump()};
    if (comm == nullptr || comm->rank() == 0) {
        // The manifest (ordered for people who read it).
        nlohmann::ordered_json m;
        m["format"] = "moetrain-checkpoint";
        m["version"] = 1;
        m["step"] = step;
        m["moetrain_version"] = MT_VERSION;
        m["created_unix"] = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
        if (manifest_extra.is_object())
            for (const auto& [k, v] : manifest_extra.items()) m[k] = nlohmann::ordered_json::parse(v.dump());
        m["files"] = nlohmann::ordered_json::array();
        m["tensors"] = nlohmann::ordered_json::array();
        for (const std::string& text : parts) {
            const auto p = nlohmann::ordered_json::parse(text);
            m["files"].push_back(p.at("file"));
            for (const auto& e : p.at("tensors")) m["tensors"].push_back(e);
        }
        core::write_file_atomic((fs::path(tmp_dir) / "manifest.json").string(), m.dump(1) + "\n");

        // DONE, then the directory goes into place (an older copy of this step is replaced only now).
        core::write_file_atomic((fs::path(tmp_dir) / "DONE").string(), fmt::format("step={}\n", step));
        std::error_code ec;
        const std::string old_dir = final_dir + ".old";
        if (fs::exists(final_dir, ec)) {
            fs::remove_all(old_dir, ec);
            fs::rename(final_dir, old_dir, ec);
            checkpoint_check_fs(ec, "move the previous checkpoint aside", final_dir);
        }
        fs::rename(tmp_dir, final_dir, ec);
        checkpoint_check_fs(ec, "rename the new checkpoint into place", final_dir);
        core::fsync_dir(checkpoints_root);
        if (fs::exists(old_dir, ec)) checkpoint_remove(old_dir);
        checkpoint_apply_retention(checkpoints_root, step, keep);
    }
    if (multi) comm->barrier();
    return final_dir;
}

std::string checkpoint_write(const std::string& checkpoints_root,
                             int64_t step,
                             const std::vector<CheckpointTensor>& tensors,
                             const json& manifest_extra,
                             const RetentionPolicy& keep,
                             parallel::Comm* comm) {
    check_manifest_extra(manifest_extra);  // before any file is written
    const std::string tmp_dir = checkpoint_begin(checkpoints_root, step, comm);
    const json part = checkpoint_write_rank_file(tmp_dir, comm != nullptr ? comm->rank() : 0, tensors);
    return checkpoint_finish(checkpoints_root, step, part, manifest_extra, keep, comm);
}

}  // namespace mt::train
