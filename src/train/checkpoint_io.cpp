// Checkpoint directory I/O: atomic step directories with a manifest and DONE, retention, validated loading and
// model-signature checks (conventions §5.2).
#include "train/checkpoint_io.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <set>

#include "core/clock.h"
#include "core/crc32c.h"
#include "core/file_util.h"
#include "parallel/comm.h"

namespace mt::train {

namespace fs = std::filesystem;
using core::ExitCode;
using nlohmann::json;

namespace {

const char* const kHintOlder =
    "resume from an older checkpoint (delete this step directory) or restore it from a backup";

// Parses "step_<digits>" (optionally followed by suffix) into *step.
bool parse_step_dir(const std::string& name, const std::string& suffix, int64_t* step) {
    if (name.size() <= 5 + suffix.size() || name.compare(0, 5, "step_") != 0) return false;
    if (name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) return false;
    const std::string digits = name.substr(5, name.size() - 5 - suffix.size());
    if (digits.size() < 8 || digits.size() > 18 || !std::all_of(digits.begin(), digits.end(), ::isdigit)) return false;
    *step = std::stoll(digits);
    return true;
}

// A damaged checkpoint: exit 4 with the "use an older one" hint.
[[noreturn]] void corrupt(const std::string& what, const std::string& where) {
    core::fail_hint(ExitCode::checkpoint, kHintOlder, "{} [{}]", what, where);
}

// Reads typed manifest fields, failing with a message naming the field and the manifest file.
struct ManifestReader {
    std::string path;
    const json& get(const json& obj, const std::string& key, const std::string& where) const {
        if (!obj.is_object() || !obj.contains(key))
            corrupt(fmt::format("manifest is missing the field {}{}", where, key), path);
        return obj.at(key);
    }
    [[noreturn]] void bad(const std::string& field, const std::string& what) const {
        corrupt(fmt::format("manifest field {} {}", field, what), path);
    }
    std::string str(const json& obj, const std::string& key, const std::string& where) const {
        const json& v = get(obj, key, where);
        if (!v.is_string()) bad(where + key, "is not a string");
        return v.get<std::string>();
    }
    int64_t integer(const json& obj, const std::string& key, const std::string& where) const {
        const json& v = get(obj, key, where);
        if (!v.is_number_integer() || v.get<int64_t>() < 0) bad(where + key, "is not a non-negative integer");
        return v.get<int64_t>();
    }
    core::Shape shape(const json& obj, const std::string& key, const std::string& where) const {
        const json& v = get(obj, key, where);
        core::Shape out;
        if (!v.is_array()) bad(where + key, "is not an array of non-negative integers");
        for (const json& d : v) {
            if (!d.is_number_integer() || d.get<int64_t>() < 0)
                bad(where + key, "is not an array of non-negative integers");
            out.push_back(d.get<int64_t>());
        }
        return out;
    }
};

bool plain_file_name(const std::string& name) {
    return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos;
}

}  // namespace

void checkpoint_check_fs(const std::error_code& ec, const char* what, const std::string& path) {
    if (ec) core::fail(ExitCode::checkpoint, "cannot {}: {} [{}]", what, ec.message(), path);
}

std::string checkpoint_dir_name(int64_t step) {
    return fmt::format("step_{:08d}", step);
}

std::vector<CheckpointEntry> checkpoint_list(const std::string& checkpoints_root) {
    std::vector<CheckpointEntry> out;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(checkpoints_root, ec)) {
        int64_t step = 0;
        if (!parse_step_dir(e.path().filename().string(), "", &step)) continue;
        std::error_code ec2;
        if (e.is_directory(ec2) && fs::is_regular_file(e.path() / "DONE", ec2))
            out.push_back({step, e.path().string()});
    }
    std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.step < b.step; });
    return out;
}

std::optional<std::string> checkpoint_find_latest(const std::string& checkpoints_root) {
    const auto all = checkpoint_list(checkpoints_root);
    if (all.empty()) return std::nullopt;
    return all.back().dir;
}

void checkpoint_remove(const std::string& dir) {
    std::error_code ec;
    fs::remove(fs::path(dir) / "DONE", ec);
    if (!ec) core::fsync_dir(dir);
    if (!ec) fs::remove_all(dir, ec);
    checkpoint_check_fs(ec, "delete the checkpoint", dir);
}

std::vector<std::string> checkpoint_apply_retention(const std::string& checkpoints_root,
                                                    int64_t current_step,
                                                    const RetentionPolicy& keep) {
    std::vector<std::string> deleted;
    const auto valid = checkpoint_list(checkpoints_root);
    if (std::none_of(valid.begin(), valid.end(), [&](const auto& c) { return c.step == current_step; })) return deleted;

    std::set<std::string> valid_dirs;
    std::vector<CheckpointEntry> older;  // valid, <= current_step, ascending
    for (const auto& c : valid) {
        valid_dirs.insert(c.dir);
        if (c.step <= current_step) older.push_back(c);
    }
    if (keep.keep_last > 0) {
        const size_t n_keep = static_cast<size_t>(keep.keep_last);
        for (size_t i = 0; i + n_keep < older.size(); ++i) {
            const auto& c = older[i];
            if (c.step == current_step || (keep.keep_every > 0 && c.step % keep.keep_every == 0)) continue;
            checkpoint_remove(c.dir);
            deleted.push_back(c.dir);
        }
    }
    // Leftovers of interrupted writes: incomplete step dirs, *.tmp and *.old, all older than the new checkpoint.
    std::error_code ec;
    std::vector<std::string> leftovers;
    for (const auto& e : fs::directory_iterator(checkpoints_root, ec)) {
        const std::string name = e.path().filename().string();
        int64_t step = 0;
        const bool stale = parse_step_dir(name, ".tmp", &step) || parse_step_dir(name, ".old", &step) ||
                           (parse_step_dir(name, "", &step) && !valid_dirs.count(e.path().string()));
        std::error_code ec2;
        if (stale && step < current_step && e.is_directory(ec2)) leftovers.push_back(e.path().string());
    }
    for (const auto& dir : leftovers) {
        checkpoint_remove(dir);
        deleted.push_back(dir);
    }
    return deleted;
}

Checkpoint checkpoint_open(const std::string& dir, CrcCheck crc_check) {
    std::error_code ec;
    const fs::file_status status = fs::status(dir, ec);
    if (!fs::exists(status)) core::fail(ExitCode::checkpoint, "checkpoint directory not found [{}]", dir);
    if (!fs::is_directory(status))
        core::fail_hint(ExitCode::checkpoint,
                        "name a checkpoint directory (run.dir/checkpoints/step_XXXXXXXX), not a file in it",
                        "not a checkpoint directory: the path is a file [{}]",
                        dir);
    const bool verify_crc = crc_check == CrcCheck::on_open;
    const std::string done_path = (fs::path(dir) / "DONE").string();
    if (!fs::exists(done_path, ec))
        core::fail_hint(ExitCode::checkpoint,
                        "the write was interrupted; resume from an older checkpoint or delete this directory",
                        "no DONE marker: the checkpoint is incomplete [{}]",
                        dir);

    Checkpoint ck;
    ck.dir_ = dir;
    const ManifestReader r{(fs::path(dir) / "manifest.json").string()};
    try {
        ck.manifest_ = json::parse(core::read_file(r.path));
    } catch (const json::exception& e) {
        corrupt(fmt::format("manifest is not valid JSON: {}", e.what()), r.path);
    }
    const json& m = ck.manifest_;
    if (!m.is_object()) r.bad("(root)", "is not a JSON object");
    if (r.str(m, "format", "") != "moetrain-checkpoint") r.bad("format", "is not \"moetrain-checkpoint\"");
    if (r.integer(m, "version", "") != 1) r.bad("version", "is not 1 (written by another moetrain version)");
    ck.step_ = r.integer(m, "step", "");
    if (core::read_file(done_path) != fmt::format("step={}\n", ck.step_))
        corrupt(fmt::format("DONE does not say step={} as the manifest does", ck.step_), done_path);

    const json& files = r.get(m, "files", "");
    if (!files.is_array()) r.bad("files", "is not an array");
    for (size_t i = 0; i < files.size(); ++i) {
        const std::string where = fmt::format("files[{}].", i);
        const std::string name = r.str(files[i], "name", where);
        if (!plain_file_name(name) || ck.files_.count(name)) r.bad(where + "name", "is not a unique plain file name");
        const uint64_t bytes = static_cast<uint64_t>(r.integer(files[i], "bytes", where));
        const std::string crc = r.str(files[i], "crc32c", where);
        if (crc.size() != 8 || !std::all_of(crc.begin(), crc.end(), ::isxdigit))
            r.bad(where + "crc32c", "is not 8 hex digits");
        const std::string path = (fs::path(dir) / name).string();
        const uint64_t actual = core::file_size(path);
        if (actual != bytes)
            corrupt(fmt::format("file has {} bytes but the manifest records {}: it is truncated", actual, bytes), path);
        const uint32_t got = verify_crc ? core::file_crc32c(path) : 0;
        if (verify_crc && got != std::stoul(crc, nullptr, 16))
            corrupt(fmt::format(
                        "CRC-32C is {} but the manifest records {}: the file is corrupt", core::crc32c_hex(got), crc),
                    path);
        ck.files_[name] = std::make_unique<SafetensorsFile>(path, ExitCode::checkpoint);
        ck.expected_crc_[ck.files_[name].get()] = crc;
        if (verify_crc) ck.verified_.insert(ck.files_[name].get());
    }
    ck.crc_ = crc_check;

    const json& tensors = r.get(m, "tensors", "");
    if (!tensors.is_array()) r.bad("tensors", "is not an array");
    for (size_t i = 0; i < tensors.size(); ++i) {
        const json& t = tensors[i];
        const std::string where = fmt::format("tensors[{}].", i);
        const std::string name = r.str(t, "name", where), kind = r.str(t, "kind", where);
        const std::string who = fmt::format(" (tensor {}, kind {})", name, kind);
        Checkpoint::Entry& e = ck.tensors_[{kind, name}];
        const std::string dtype = r.str(t, "dtype", where);
        const core::Shape global = r.shape(t, "global_shape", where);
        if (!e.regions.empty() && (e.dtype != dtype || e.global_shape != global))
            r.bad(where + "global_shape", "or dtype disagrees with an earlier entry" + who);
        e.dtype = dtype;
        e.global_shape = global;
        Checkpoint::Region reg;
        const std::string file = r.str(t, "file", where);
        if (!ck.files_.count(file)) r.bad(where + "file", "names a file that is not in files" + who);
        reg.file = ck.files_.at(file).get();
        reg.key = r.str(t, "key", where);
        if (!reg.file->has(reg.key)) r.bad(where + "key", fmt::format("{} is not in {}{}", reg.key, file, who));
        core::Shape stored;
        if (t.contains("flat_range")) {
            const core::Shape range = r.shape(t, "flat_range", where);
            if (range.size() != 2 || range[0] > range[1] || range[1] > core::shape_numel(global))
                r.bad(where + "flat_range", "is not [begin, end) inside the tensor" + who);
            reg.flat = true;
            reg.flat_begin = range[0];
            reg.flat_end = range[1];
            stored = {range[1] - range[0]};
        } else {
            reg.offset = r.shape(t, "offset", where);
            reg.shape = r.shape(t, "shape", where);
            bool inside = reg.offset.size() == global.size() && reg.shape.size() == global.size();
            for (size_t d = 0; inside && d < global.size(); ++d) inside = reg.offset[d] + reg.shape[d] <= global[d];
            if (!inside) r.bad(where + "offset", "and shape are not a box inside global_shape" + who);
            stored = reg.shape;
        }
        const SafetensorsInfo& info = reg.file->info(reg.key);
        if (info.shape != stored || info.dtype_name != dtype)
            r.bad(where + "shape",
                  fmt::format("says {} {} but {} holds {} {}{}",
                              dtype,
                              core::shape_str(stored),
                              file,
                              info.dtype_name,
                              core::shape_str(info.shape),
                              who));
        e.regions.push_back(std::move(reg));
    }
    for (const auto& [key, e] : ck.tensors_) {
        int64_t covered = 0;
        for (const auto& reg : e.regions)
            covered += reg.flat ? reg.flat_end - reg.flat_begin : core::shape_numel(reg.shape);
        if (covered != core::shape_numel(e.global_shape))
            r.bad("tensors",
                  fmt::format("cover {} of the {} elements of tensor {}, kind {}",
                              covered,
                              core::shape_numel(e.global_shape),
                              key.second,
                              key.first));
    }
    return ck;
}

void Checkpoint::verify_before_read(const SafetensorsFile* file) const {
    if (crc_ != CrcCheck::on_read || verified_.count(file)) return;
    const std::string& want = expected_crc_.at(file);
    const auto start = std::chrono::steady_clock::now();
    const uint32_t got = core::file_crc32c(file->path());
    crc_seconds_ += core::seconds_since(start);
    if (got != std::stoul(want, nullptr, 16))
        corrupt(
            fmt::format("CRC-32C is {} but the manifest records {}: the file is corrupt", core::crc32c_hex(got), want),
            file->path());
    verified_.insert(file);
}

const Checkpoint::Entry& Checkpoint::entry(const std::string& kind, const std::string& name) const {
    const auto it = tensors_.find({kind, name});
    if (it == tensors_.end())
        core::fail(ExitCode::checkpoint, "the checkpoint has no tensor {} of kind {} [{}]", name, kind, dir_);
    return it->second;
}

std::vector<std::string> Checkpoint::names(const std::string& kind) const {
    std::vector<std::string> out;
    for (const auto& [key, e] : tensors_)
        if (key.first == kind) out.push_back(key.second);
    return out;
}

const core::Shape& Checkpoint::global_shape(const std::string& kind, const std::string& name) const {
    return entry(kind, name).global_shape;
}

const std::string& Checkpoint::dtype_name(const std::string& kind, const std::string& name) const {
    return entry(kind, name).dtype;
}

void Checkpoint::read_into(const std::string& kind, const std::string& name, const core::Tensor& dst) const {
    const Entry& e = entry(kind, name);
    MT_CHECK(dst.defined() && dst.device() == core::Device::cpu, "Checkpoint::read_into needs a CPU tensor ({})", name);
    if (dst.shape() != e.global_shape)
        core::fail(ExitCode::checkpoint,
                   "tensor {} ({}) has shape {} in the checkpoint but {} in the model [{}]",
                   name,
                   kind,
                   core::shape_str(e.global_shape),
                   core::shape_str(dst.shape()),
                   dir_);
    const bool any_flat = std::any_of(e.regions.begin(), e.regions.end(), [](const Region& r) { return r.flat; });
    if (any_flat && !dst.is_contiguous()) {
        core::Tensor tmp = core::Tensor::zeros(dst.shape(), dst.dtype());
        read_into(kind, name, tmp);
        dst.copy_from(tmp);
        return;
    }
    for (const Region& reg : e.regions) {
        core::Tensor view = dst;
        if (reg.flat) {
            view = dst.reshape({dst.numel()}).slice(0, reg.flat_begin, reg.flat_end);
        } else {
            for (size_t d = 0; d < reg.offset.size(); ++d)
                view = view.slice(static_cast<int>(d), reg.offset[d], reg.offset[d] + reg.shape[d]);
        }
        verify_before_read(reg.file);
        reg.file->read_into(reg.key, view);
    }
}

namespace {

// The run [first, first + count) that a box (offset, shape) covers in the row-major flattening of `global`, when
// it is one run: every dimension after the first one of extent above 1 is whole (a slab of leading-dimension rows,
// as an expert shard is). False otherwise.
bool box_as_run(
    const core::Shape& global, const core::Shape& offset, const core::Shape& shape, int64_t* first, int64_t* count) {
    size_t k = 0;
    while (k + 1 < shape.size() && shape[k] == 1) ++k;
    for (size_t d = k + 1; d < shape.size(); ++d)
        if (shape[d] != global[d]) return false;
    const core::Shape strides = core::contiguous_strides(global);
    *first = 0;
    for (size_t d = 0; d < offset.size(); ++d) *first += offset[d] * strides[d];
    *count = core::shape_numel(shape);
    return true;
}

}  // namespace

void Checkpoint::read_flat(const std::string& kind,
                           const std::string& name,
                           int64_t begin,
                           const core::Tensor& dst) const {
    const Entry& e = entry(kind, name);
    const int64_t n = dst.numel(), total = core::shape_numel(e.global_shape);
    MT_CHECK(dst.ndim() == 1 && dst.is_contiguous() && begin >= 0 && begin + n <= total,
             "Checkpoint::read_flat: elements [{}, {}) of {} ({} elements) into a {} tensor",
             begin,
             begin + n,
             name,
             total,
             core::shape_str(dst.shape()));
    struct Run {
        const Region* region;
        int64_t first, count;
    };
    std::vector<Run> runs;
    for (const Region& reg : e.regions) {
        Run run{&reg, reg.flat_begin, reg.flat_end - reg.flat_begin};
        if (!reg.flat && !box_as_run(e.global_shape, reg.offset, reg.shape, &run.first, &run.count)) {
            const core::Tensor whole = core::Tensor::zeros(e.global_shape, dst.dtype());
            read_into(kind, name, whole);
            dst.copy_from(whole.reshape({total}).slice(0, begin, begin + n));
            return;
        }
        runs.push_back(run);
    }
    for (const Run& run : runs) {
        const int64_t lo = std::max(begin, run.first), hi = std::min(begin + n, run.first + run.count);
        if (lo >= hi) continue;
        verify_before_read(run.region->file);
        const SafetensorsInfo& info = run.region->file->info(run.region->key);
        if (!info.dtype_supported || core::dtype_is_float(info.dtype) != core::dtype_is_float(dst.dtype()))
            core::fail(ExitCode::checkpoint,
                       "tensor {} ({}) is {} in the checkpoint and cannot be loaded as {} [{}]",
                       name,
                       kind,
                       info.dtype_name,
                       core::dtype_name(dst.dtype()),
                       dir_);
        const uint8_t* raw =
            run.region->file->raw_bytes(run.region->key) + static_cast<size_t>(lo - run.first) * info.element_size;
        const core::Tensor part = dst.slice(0, lo - begin, hi - begin);
        if (part.device() != core::Device::cpu && info.dtype == dst.dtype()) {
            // Out of the file's mapping onto the device through pinned buffers, at the host's memory speed (a
            // resume's 31 GB: staged_upload.h).
            if (!upload_ || upload_->device() != part.device())
                upload_ = std::make_unique<core::StagedUpload>(part.device());
            upload_->copy(part.raw(), raw, part.nbytes());
            continue;
        }
        const core::Tensor saved = core::Tensor::borrow(const_cast<uint8_t*>(raw), {hi - lo}, info.dtype);
        part.copy_from(saved);
    }
}

core::Tensor Checkpoint::read(const std::string& kind, const std::string& name) const {
    const Entry& e = entry(kind, name);
    core::DType dtype;
    if (!core::dtype_from_safetensors_name(e.dtype, &dtype))
        core::fail(ExitCode::checkpoint,
                   "tensor {} ({}) has dtype {}, which moetrain cannot load [{}]",
                   name,
                   kind,
                   e.dtype,
                   dir_);
    core::Tensor t = core::Tensor::zeros(e.global_shape, dtype);
    read_into(kind, name, t);
    return t;
}

namespace {
std::string spec_line(const TensorSpec& s) {
    return fmt::format("{}\t{}\t{}\n", s.name, core::shape_str(s.shape), core::dtype_safetensors_name(s.dtype));
}
bool spec_less(const TensorSpec& a, const TensorSpec& b) {
    return spec_line(a) < spec_line(b);
}
}  // namespace

std::string model_signature(const std::vector<TensorSpec>& specs) {
    std::vector<TensorSpec> sorted = specs;
    std::sort(sorted.begin(), sorted.end(), spec_less);
    std::string text;
    for (const auto& s : sorted) text += spec_line(s);
    return core::sha256_hex(text);
}

void checkpoint_check_fits(const json& manifest, const std::vector<TensorSpec>& expected, const std::string& dir) {
    const std::string want = model_signature(expected);
    const auto sig = manifest.find("model_signature");
    if (sig != manifest.end() && sig->is_string() && sig->get<std::string>() == want) return;

    // The checkpoint's params: name -> (dtype name, global shape).
    std::map<std::string, std::pair<std::string, core::Shape>> saved;
    const ManifestReader r{(fs::path(dir) / "manifest.json").string()};
    const json& tensors = r.get(manifest, "tensors", "");
    if (!tensors.is_array()) r.bad("tensors", "is not an array");
    for (size_t i = 0; i < tensors.size(); ++i) {
        const std::string where = fmt::format("tensors[{}].", i);
        if (r.str(tensors[i], "kind", where) != "param") continue;
        saved[r.str(tensors[i], "name", where)] = {r.str(tensors[i], "dtype", where),
                                                   r.shape(tensors[i], "global_shape", where)};
    }
    std::map<std::string, const TensorSpec*> model;
    for (const auto& s : expected) model[s.name] = &s;

    const char* hint =
        "the model in the job config differs from the one this checkpoint was saved with; resume with the config "
        "in the checkpoint's manifest (config_toml), or use a new run directory to start fresh";
    const auto misfit = [&](const std::string& what) {
        core::fail_hint(ExitCode::checkpoint, hint, "checkpoint does not fit the model: {} [{}]", what, dir);
    };
    auto s = saved.begin();
    auto m = model.begin();
    for (; s != saved.end() || m != model.end(); ++s, ++m) {
        if (s == saved.end() || (m != model.end() && m->first < s->first))
            misfit(fmt::format("tensor {} is missing from the checkpoint", m->first));
        if (m == model.end() || s->first < m->first)
            misfit(fmt::format("the checkpoint has tensor {}, which the model does not", s->first));
        const auto& [dtype, shape] = s->second;
        const TensorSpec& spec = *m->second;
        if (shape != spec.shape)
            misfit(fmt::format("tensor {} has shape {} in the checkpoint but {} in the model",
                               spec.name,
                               core::shape_str(shape),
                               core::shape_str(spec.shape)));
        if (dtype != core::dtype_safetensors_name(spec.dtype))
            misfit(fmt::format("tensor {} has dtype {} in the checkpoint but {} in the model",
                               spec.name,
                               dtype,
                               core::dtype_safetensors_name(spec.dtype)));
    }
    if (sig != manifest.end())
        misfit(fmt::format(
            "its model_signature {} differs from the model's {} although the param tensors agree", sig->dump(), want));
}

}  // namespace mt::train
