// Checkpoint directories (conventions §5.2): step_%08d/ holding rank_%05d.safetensors, manifest.json and a DONE
// marker; writing with retention, finding the newest valid one, opening and verifying it, and model signatures.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "core/staged_upload.h"
#include "core/tensor.h"
#include "train/safetensors.h"

namespace mt::parallel {
class Comm;
}

namespace mt::train {

// One tensor to save: its canonical name, its state family ("param", "master", "adamw.m", "adamw.v",
// "muon.momentum", "rng", ...) and the CPU tensor. A rank that holds part of a tensor says where it sits in the
// global one (conventions §5.2 regions): global_shape (empty: the tensor is the whole global tensor) and either a
// box offset (empty: zeros) or flat_begin >= 0, the start of a range of the flattened global tensor (ZeRO state).
struct CheckpointTensor {
    std::string name;
    std::string kind;
    core::Tensor tensor;
    core::Shape global_shape = {};
    core::Shape offset = {};
    int64_t flat_begin = -1;
};

// Which older checkpoints survive a new one: the keep_last newest (<= 0 keeps all) plus every step that is a
// multiple of keep_every (when > 0).
struct RetentionPolicy {
    int64_t keep_last = 3;
    int64_t keep_every = 0;
};

// A tensor the model expects: name, global shape, dtype (the dtype its "param" entry is saved with).
struct TensorSpec {
    std::string name;
    core::Shape shape;
    core::DType dtype = core::DType::f32;
};

// "step_00001000" for step 1000.
std::string checkpoint_dir_name(int64_t step);

// Writes a complete checkpoint to ROOT/step_%08d: each rank's tensors go to rank_%05d.safetensors under keys
// "<kind>/<name>", then rank 0 writes manifest.json (every rank's regions) and DONE, all inside ROOT/step_%08d.tmp,
// which rank 0 renames into place at the end (an existing checkpoint of the same step is replaced only then).
// Afterwards rank 0 applies retention. With a communicator of several ranks this is collective over it (the
// conventions §5.2 protocol: files, barrier, manifest, DONE, barrier); the directory must be on a file system all
// ranks share.
// @param[in] checkpoints_root  ROOT, created when missing
// @param[in] step              the optimizer step the state belongs to
// @param[in] tensors           every region to save; a (kind, name) pair comes more than once only for disjoint
//                              regions of one tensor (each written under its own key)
// @param[in] manifest_extra    a JSON object whose fields are copied into the manifest (config_toml,
//                              model_signature, mesh, rng, data, tokens_seen, git_commit, ...); it must not set
//                              format, version, step, moetrain_version, created_unix, files or tensors
// @param[in] keep              retention policy applied once the new checkpoint is complete
// @param[in] comm              the ranks writing together (nullptr: this process alone); manifest_extra and keep
//                              are taken from its rank 0
// @return the checkpoint directory
std::string checkpoint_write(const std::string& checkpoints_root,
                             int64_t step,
                             const std::vector<CheckpointTensor>& tensors,
                             const nlohmann::json& manifest_extra,
                             const RetentionPolicy& keep = {},
                             parallel::Comm* comm = nullptr);

// checkpoint_write in its three phases, for a write whose middle runs on a background thread
// (train/async_checkpoint.h): checkpoint_begin (collective over comm: rank 0 makes ROOT/step_%08d.tmp; returns it),
// checkpoint_write_rank_file (this rank's file into it; no communication, any thread; returns this rank's part of
// the manifest: its file with size and CRC-32C, and its tensors' regions) and checkpoint_finish (collective: rank 0
// gathers the parts, writes manifest.json and DONE, renames the directory into place and applies retention).
std::string checkpoint_begin(const std::string& checkpoints_root, int64_t step, parallel::Comm* comm = nullptr);
nlohmann::json checkpoint_write_rank_file(const std::string& tmp_dir,
                                          int rank,
                                          const std::vector<CheckpointTensor>& tensors);
std::string checkpoint_finish(const std::string& checkpoints_root,
                              int64_t step,
                              const nlohmann::json& part,
                              const nlohmann::json& manifest_extra,
                              const RetentionPolicy& keep = {},
                              parallel::Comm* comm = nullptr);

// Ends the run with exit 4 when a filesystem call of the checkpoint code failed: "cannot <what>: <reason> [<path>]".
void checkpoint_check_fs(const std::error_code& ec, const char* what, const std::string& path);

// A valid (DONE) checkpoint directory under a root.
struct CheckpointEntry {
    int64_t step = 0;
    std::string dir;
};

// Every valid checkpoint under ROOT, by ascending step; incomplete directories and *.tmp are skipped. A missing
// root gives an empty list.
std::vector<CheckpointEntry> checkpoint_list(const std::string& checkpoints_root);

// The directory of the highest-step checkpoint that has DONE, or nullopt when there is none.
std::optional<std::string> checkpoint_find_latest(const std::string& checkpoints_root);

// Deletes the checkpoints the policy does not keep, considering only steps <= current_step (newer ones are left
// alone, and current_step itself is always kept), plus leftovers of interrupted writes older than current_step.
// Does nothing unless current_step is a valid checkpoint. @return the deleted directories
std::vector<std::string> checkpoint_apply_retention(const std::string& checkpoints_root,
                                                    int64_t current_step,
                                                    const RetentionPolicy& keep);

// Deletes one checkpoint directory: DONE first (fsynced), then its files, then the directory.
void checkpoint_remove(const std::string& dir);

// When checkpoint_open checks each file's CRC-32C against the manifest: never, every file before it returns
// (`inspect --verify`), or each file just before this process first reads a tensor from it, so that each rank of a
// resume verifies the files it reads and no others (checkpoint.verify_on_resume).
enum class CrcCheck { off, on_open, on_read };

// An opened, validated checkpoint (see checkpoint_open).
class Checkpoint {
   public:
    const std::string& dir() const {
        return dir_;
    }
    const nlohmann::json& manifest() const {
        return manifest_;
    }
    int64_t step() const {
        return step_;
    }
    bool has(const std::string& kind, const std::string& name) const {
        return tensors_.count({kind, name}) != 0;
    }
    // Names saved under a kind, sorted.
    std::vector<std::string> names(const std::string& kind) const;
    // Global shape and safetensors dtype name of a saved tensor (fails naming it when absent).
    const core::Shape& global_shape(const std::string& kind, const std::string& name) const;
    const std::string& dtype_name(const std::string& kind, const std::string& name) const;
    // Copies a saved tensor into dst (CPU, the global shape, any strides; dtypes convert float <-> float and
    // int <-> int). Fails with exit code 4 naming the tensor and the directory when it is missing or its shape
    // differs.
    // @param[out] dst  the destination
    void read_into(const std::string& kind, const std::string& name, const core::Tensor& dst) const;
    // A new contiguous CPU tensor with the saved values, in the saved dtype.
    core::Tensor read(const std::string& kind, const std::string& name) const;
    // Elements [begin, begin + dst.numel()) of a saved tensor's row-major flattened global form into dst (a
    // contiguous 1-D tensor on any device; float dtypes convert), reading only the saved parts that overlap them,
    // so a rank's share of an expert-sharded parameter or of ZeRO state costs its own size, not the tensor's. A
    // saved box that is not one run of the flattened tensor makes it read the whole tensor instead. Onto a device
    // in the saved dtype the bytes go through core::StagedUpload, ordered on the current lane.
    void read_flat(const std::string& kind, const std::string& name, int64_t begin, const core::Tensor& dst) const;

    // Files whose CRC-32C this object has checked so far.
    size_t files_verified() const {
        return verified_.size();
    }
    size_t files_count() const {
        return files_.size();
    }
    // Wall time spent in CrcCheck::on_read's checks so far (a resume's share of its load, in the `resumed` event).
    double crc_seconds() const {
        return crc_seconds_;
    }

   private:
    friend Checkpoint checkpoint_open(const std::string& dir, CrcCheck crc);
    // CrcCheck::on_read: checks the file's CRC-32C the first time (exit 4 naming it when it differs).
    void verify_before_read(const SafetensorsFile* file) const;
    struct Region {
        const SafetensorsFile* file = nullptr;
        std::string key;
        bool flat = false;
        core::Shape offset, shape;             // a box
        int64_t flat_begin = 0, flat_end = 0;  // or a range of the flattened tensor
    };
    struct Entry {
        std::string dtype;
        core::Shape global_shape;
        std::vector<Region> regions;
    };
    const Entry& entry(const std::string& kind, const std::string& name) const;
    std::string dir_;
    nlohmann::json manifest_;
    int64_t step_ = 0;
    std::map<std::string, std::unique_ptr<SafetensorsFile>> files_;
    std::map<std::pair<std::string, std::string>, Entry> tensors_;
    CrcCheck crc_ = CrcCheck::off;
    std::map<const SafetensorsFile*, std::string> expected_crc_;  // 8 hex digits, from the manifest
    mutable std::set<const SafetensorsFile*> verified_;
    mutable double crc_seconds_ = 0.0;
    // read_flat's copies onto a device (made at the first, freed with the checkpoint)
    mutable std::unique_ptr<core::StagedUpload> upload_;
};

// Opens a checkpoint directory: DONE must exist (else exit 4 "no DONE marker: the checkpoint is incomplete"),
// manifest.json must parse and hold every required field, each listed file must exist with its recorded size (and
// CRC-32C when verify_crc), and every tensor entry must match its safetensors file. Every failure is an Error with
// exit code 4 naming the directory or file.
// @param[in] dir  the step directory
// @param[in] crc  when to check each file's CRC-32C (reading every byte of it)
Checkpoint checkpoint_open(const std::string& dir, CrcCheck crc);
// The same; verify_crc checks every file's CRC-32C before returning (`--verify`).
inline Checkpoint checkpoint_open(const std::string& dir, bool verify_crc = false) {
    return checkpoint_open(dir, verify_crc ? CrcCheck::on_open : CrcCheck::off);
}

// The model signature: SHA-256 (hex) of the lines "name\t[d0, d1]\tDTYPE\n" of the specs sorted by name.
std::string model_signature(const std::vector<TensorSpec>& specs);

// Checks that a checkpoint fits the model: when the manifest's model_signature differs from the specs', fails with
// exit code 4 naming the first tensor (by name) that differs: missing from the checkpoint, extra in it, or a
// different shape or dtype (both given). The checkpoint's side is its "param" tensor entries.
// @param[in] manifest  the checkpoint manifest
// @param[in] expected  the model's tensors
// @param[in] dir       the checkpoint directory, for the message
void checkpoint_check_fits(const nlohmann::json& manifest,
                           const std::vector<TensorSpec>& expected,
                           const std::string& dir);

}  // namespace mt::train
