// safetensors writer (aligned, atomic) and validating reader over a memory map.
#include "train/safetensors.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <string_view>

namespace mt::train {

static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes a little-endian host");

namespace {

constexpr uint64_t kMaxHeader = 100000000;

struct StDType {
    std::string_view name;
    size_t size;
};
// Every dtype of the safetensors spec, including the two fp8 spellings readers must accept.
constexpr std::array<StDType, 15> kStDTypes = {{{"BOOL", 1},
                                                {"U8", 1},
                                                {"I8", 1},
                                                {"I16", 2},
                                                {"U16", 2},
                                                {"F16", 2},
                                                {"BF16", 2},
                                                {"I32", 4},
                                                {"U32", 4},
                                                {"F32", 4},
                                                {"F64", 8},
                                                {"I64", 8},
                                                {"U64", 8},
                                                {"F8_E4M3", 1},
                                                {"F8_E5M2", 1}}};

// Copies a tensor's elements between two strided layouts of the same shape, byte-exact (no conversion).
void copy_strided(uint8_t* dst,
                  const core::Shape& dst_strides,
                  const uint8_t* src,
                  const core::Shape& src_strides,
                  const core::Shape& shape,
                  size_t es) {
    const int64_t n = core::shape_numel(shape);
    if (n == 0) return;
    const int nd = static_cast<int>(shape.size());
    std::vector<int64_t> index(shape.size(), 0);
    int64_t so = 0, dof = 0;
    for (int64_t i = 0; i < n; ++i) {
        std::memcpy(dst + dof * static_cast<int64_t>(es), src + so * static_cast<int64_t>(es), es);
        for (int d = nd - 1; d >= 0; --d) {
            if (++index[d] < shape[d]) {
                so += src_strides[d];
                dof += dst_strides[d];
                break;
            }
            so -= src_strides[d] * (shape[d] - 1);
            dof -= dst_strides[d] * (shape[d] - 1);
            index[d] = 0;
        }
    }
}

bool dtype_is_int(core::DType d) {
    return !core::dtype_is_float(d);
}

// Reads a JSON integer >= 0 into *out.
bool json_u64(const nlohmann::json& j, uint64_t* out) {
    if (j.is_number_unsigned()) {
        *out = j.get<uint64_t>();
        return true;
    }
    if (j.is_number_integer() && j.get<int64_t>() >= 0) {
        *out = static_cast<uint64_t>(j.get<int64_t>());
        return true;
    }
    return false;
}

}  // namespace

SafetensorsWriteResult safetensors_write(const std::string& path,
                                         const std::vector<std::pair<std::string, core::Tensor>>& tensors,
                                         const std::map<std::string, std::string>& metadata,
                                         core::ExitCode code) {
    std::vector<const std::pair<std::string, core::Tensor>*> order;
    std::set<std::string_view> names;
    for (const auto& item : tensors) {
        MT_CHECK(item.second.defined(), "safetensors_write: tensor {} is undefined [{}]", item.first, path);
        MT_CHECK(item.second.device() == core::Device::cpu,
                 "safetensors_write: tensor {} lives on {}; copy it to the CPU first [{}]",
                 item.first,
                 core::device_name(item.second.device()),
                 path);
        MT_CHECK(item.first != "__metadata__" && !item.first.empty(), "safetensors_write: bad tensor name [{}]", path);
        MT_CHECK(names.insert(item.first).second, "safetensors_write: tensor {} given twice [{}]", item.first, path);
        order.push_back(&item);
    }
    std::sort(order.begin(), order.end(), [](const auto* a, const auto* b) {
        const size_t ea = core::dtype_size(a->second.dtype()), eb = core::dtype_size(b->second.dtype());
        return ea != eb ? ea > eb : a->first < b->first;
    });

    nlohmann::ordered_json header = nlohmann::ordered_json::object();
    if (!metadata.empty()) {
        header["__metadata__"] = nlohmann::ordered_json::object();
        for (const auto& [k, v] : metadata) header["__metadata__"][k] = v;
    }
    uint64_t offset = 0;
    for (const auto* item : order) {
        const core::Tensor& t = item->second;
        const uint64_t end = offset + t.nbytes();
        header[item->first] = {{"dtype", std::string(core::dtype_safetensors_name(t.dtype()))},
                               {"shape", t.shape()},
                               {"data_offsets", {offset, end}}};
        offset = end;
    }
    std::string text;
    try {
        text = header.dump();
    } catch (const nlohmann::json::exception& e) {
        core::fail(core::ExitCode::internal, "safetensors_write: cannot encode the header: {} [{}]", e.what(), path);
    }
    text.append((8 - (8 + text.size()) % 8) % 8, ' ');
    if (text.size() > kMaxHeader)
        core::fail(code, "safetensors header of {} bytes exceeds the limit of {} [{}]", text.size(), kMaxHeader, path);

    core::AtomicFileWriter out(path, code);
    const uint64_t n = text.size();
    out.write(&n, 8);
    out.write(text);
    for (const auto* item : order) {
        const core::Tensor& t = item->second;
        if (t.nbytes() == 0) continue;
        if (t.is_contiguous()) {
            out.write(t.raw(), t.nbytes());
        } else {
            std::vector<uint8_t> buf(t.nbytes());
            copy_strided(buf.data(),
                         core::contiguous_strides(t.shape()),
                         static_cast<const uint8_t*>(t.raw()),
                         t.strides(),
                         t.shape(),
                         core::dtype_size(t.dtype()));
            out.write(buf.data(), buf.size());
        }
    }
    out.commit();
    return {out.bytes(), out.crc32c()};
}

SafetensorsFile::SafetensorsFile(const std::string& path, core::ExitCode code) : path_(path), code_(code) {
    map_ = std::make_unique<core::MappedFile>(path, code);
    parse_header();
}

void SafetensorsFile::parse_header() {
    const uint64_t size = map_->size();
    if (size < 8) core::fail(code_, "safetensors file is shorter than 8 bytes ({} bytes) [{}]", size, path_);
    uint64_t n = 0;
    std::memcpy(&n, map_->data(), 8);
    if (n > kMaxHeader)
        core::fail(code_, "safetensors header length {} exceeds the limit of {} bytes [{}]", n, kMaxHeader, path_);
    if (8 + n > size)
        core::fail(
            code_, "safetensors header length {} goes beyond the end of the file ({} bytes) [{}]", n, size, path_);
    data_start_ = 8 + n;
    const std::string_view text(reinterpret_cast<const char*>(map_->data()) + 8, n);
    if (text.empty() || text[0] != '{') core::fail(code_, "safetensors header does not start with '{{' [{}]", path_);

    // Parse, rejecting a key that appears twice in any object (nlohmann would silently keep the last one).
    std::vector<std::set<std::string>> seen;
    std::string duplicate;
    const auto callback = [&](int, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
        using E = nlohmann::json::parse_event_t;
        if (event == E::object_start) seen.emplace_back();
        if (event == E::object_end && !seen.empty()) seen.pop_back();
        if (event == E::key && !seen.empty() && !seen.back().insert(parsed.get<std::string>()).second &&
            duplicate.empty())
            duplicate = parsed.get<std::string>();
        return true;
    };
    nlohmann::json header;
    try {
        header = nlohmann::json::parse(text.begin(), text.end(), callback);
    } catch (const nlohmann::json::exception& e) {
        core::fail(code_, "safetensors header is not valid JSON: {} [{}]", e.what(), path_);
    }
    if (!duplicate.empty()) core::fail(code_, "safetensors header has the key \"{}\" twice [{}]", duplicate, path_);
    if (!header.is_object()) core::fail(code_, "safetensors header is not a JSON object [{}]", path_);

    const uint64_t buffer = size - data_start_;
    for (const auto& [name, entry] : header.items()) {
        if (name == "__metadata__") {
            if (!entry.is_object()) core::fail(code_, "safetensors __metadata__ is not an object [{}]", path_);
            for (const auto& [k, v] : entry.items()) {
                if (!v.is_string())
                    core::fail(code_, "safetensors __metadata__ value of \"{}\" is not a string [{}]", k, path_);
                metadata_[k] = v.get<std::string>();
            }
            continue;
        }
        if (!entry.is_object()) core::fail(code_, "tensor {}: header entry is not an object [{}]", name, path_);
        SafetensorsInfo info;
        const auto dt = entry.find("dtype");
        if (dt == entry.end() || !dt->is_string())
            core::fail(code_, "tensor {}: header entry has no dtype string [{}]", name, path_);
        info.dtype_name = dt->get<std::string>();
        for (const auto& d : kStDTypes)
            if (d.name == info.dtype_name) info.element_size = d.size;
        if (info.element_size == 0)
            core::fail(code_, "tensor {}: unknown dtype \"{}\" [{}]", name, info.dtype_name, path_);
        info.dtype_supported = core::dtype_from_safetensors_name(info.dtype_name, &info.dtype);

        const auto sh = entry.find("shape");
        uint64_t bytes = info.element_size;
        bool shape_ok = sh != entry.end() && sh->is_array();
        if (shape_ok) {
            for (const auto& d : *sh) {
                uint64_t v = 0;
                if (!json_u64(d, &v) || v > static_cast<uint64_t>(INT64_MAX) ||
                    __builtin_mul_overflow(bytes, v, &bytes)) {
                    shape_ok = false;
                    break;
                }
                info.shape.push_back(static_cast<int64_t>(v));
            }
        }
        if (!shape_ok)
            core::fail(code_,
                       "tensor {}: shape is not an array of non-negative integers with a representable size [{}]",
                       name,
                       path_);

        const auto off = entry.find("data_offsets");
        if (off == entry.end() || !off->is_array() || off->size() != 2 || !json_u64((*off)[0], &info.begin) ||
            !json_u64((*off)[1], &info.end) || info.begin > info.end)
            core::fail(code_, "tensor {}: data_offsets is not [begin, end] with begin <= end [{}]", name, path_);
        if (info.end - info.begin != bytes)
            core::fail(code_,
                       "tensor {}: shape {} of {} needs {} bytes but data_offsets [{}, {}) hold {} [{}]",
                       name,
                       core::shape_str(info.shape),
                       info.dtype_name,
                       bytes,
                       info.begin,
                       info.end,
                       info.end - info.begin,
                       path_);
        if (info.end > buffer)
            core::fail(code_,
                       "tensor {}: data_offsets [{}, {}) go beyond the data buffer of {} bytes [{}]",
                       name,
                       info.begin,
                       info.end,
                       buffer,
                       path_);
        entries_.emplace(name, std::move(info));
    }

    // The buffer must be covered exactly: sorted by offsets, each tensor starts where the previous one ended.
    std::vector<std::pair<const std::string*, const SafetensorsInfo*>> sorted;
    for (const auto& [name, info] : entries_) sorted.emplace_back(&name, &info);
    std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) {
        return std::pair(a.second->begin, a.second->end) < std::pair(b.second->begin, b.second->end);
    });
    uint64_t pos = 0;
    const std::string* prev = nullptr;
    for (const auto& [name, info] : sorted) {
        if (info->begin < pos)
            core::fail(code_, "tensors {} and {} overlap in the data buffer [{}]", *prev, *name, path_);
        if (info->begin > pos)
            core::fail(code_, "bytes [{}, {}) of the data buffer belong to no tensor [{}]", pos, info->begin, path_);
        pos = info->end;
        prev = name;
    }
    if (pos != buffer)
        core::fail(code_, "bytes [{}, {}) of the data buffer belong to no tensor [{}]", pos, buffer, path_);
}

std::vector<std::string> SafetensorsFile::keys() const {
    std::vector<std::string> out;
    out.reserve(entries_.size());
    for (const auto& [name, info] : entries_) out.push_back(name);
    return out;
}

const SafetensorsInfo& SafetensorsFile::info(const std::string& name) const {
    const auto it = entries_.find(name);
    if (it == entries_.end()) core::fail(code_, "tensor {} is not in the file [{}]", name, path_);
    return it->second;
}

const uint8_t* SafetensorsFile::raw_bytes(const std::string& name) const {
    return map_->data() + data_start_ + info(name).begin;
}

core::Tensor SafetensorsFile::read(const std::string& name) const {
    const SafetensorsInfo& i = info(name);
    if (!i.dtype_supported)
        core::fail(code_, "tensor {} has dtype {}, which moetrain cannot load [{}]", name, i.dtype_name, path_);
    core::Tensor t = core::Tensor::zeros(i.shape, i.dtype);
    if (i.end > i.begin) std::memcpy(t.raw(), raw_bytes(name), i.end - i.begin);
    return t;
}

void SafetensorsFile::read_into(const std::string& name, const core::Tensor& dst) const {
    const SafetensorsInfo& i = info(name);
    MT_CHECK(dst.defined() && dst.device() == core::Device::cpu, "read_into needs a defined CPU tensor ({})", name);
    if (dst.shape() != i.shape)
        core::fail(code_,
                   "tensor {} has shape {} in the file but {} is expected [{}]",
                   name,
                   core::shape_str(i.shape),
                   core::shape_str(dst.shape()),
                   path_);
    if (!i.dtype_supported)
        core::fail(code_, "tensor {} has dtype {}, which moetrain cannot load [{}]", name, i.dtype_name, path_);
    if (i.dtype == dst.dtype() && dst.is_contiguous()) {
        if (i.end > i.begin) std::memcpy(dst.raw(), raw_bytes(name), i.end - i.begin);
        return;
    }
    if (i.dtype == dst.dtype()) {
        copy_strided(static_cast<uint8_t*>(dst.raw()),
                     dst.strides(),
                     raw_bytes(name),
                     core::contiguous_strides(i.shape),
                     i.shape,
                     i.element_size);
        return;
    }
    if (dtype_is_int(i.dtype) != dtype_is_int(dst.dtype()))
        core::fail(code_,
                   "tensor {} is {} in the file and cannot be loaded as {} [{}]",
                   name,
                   i.dtype_name,
                   core::dtype_name(dst.dtype()),
                   path_);
    dst.copy_from(read(name));
}

}  // namespace mt::train
