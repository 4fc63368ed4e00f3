// safetensors files (conventions §5.1): an atomic writer that pads and orders for alignment, and a reader that
// validates every byte of the header before handing out tensors.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/file_util.h"
#include "core/tensor.h"

namespace mt::train {

// What safetensors_write produced: the file's size and CRC-32C (for a checkpoint manifest).
struct SafetensorsWriteResult {
    uint64_t bytes = 0;
    uint32_t crc32c = 0;
};

// Writes tensors and string metadata to a safetensors file, atomically (PATH.tmp, fsync, rename): a failure leaves
// no file under PATH. The header is space-padded so that 8 + N is a multiple of 8, and tensors are laid out by
// element size (descending) and then name, so each is aligned to its element size. Non-contiguous tensors are
// written contiguous. Tensors must live on the CPU; names must be unique and not "__metadata__".
// @param[in] path      the final file name
// @param[in] tensors   (name, tensor) pairs, in any order
// @param[in] metadata  the "__metadata__" map (omitted from the file when empty)
// @param[in] code      exit code of the Error thrown on an I/O failure
SafetensorsWriteResult safetensors_write(const std::string& path,
                                         const std::vector<std::pair<std::string, core::Tensor>>& tensors,
                                         const std::map<std::string, std::string>& metadata = {},
                                         core::ExitCode code = core::ExitCode::checkpoint);

// One header entry. dtype_name is the file's spelling ("BF16"); dtype is valid only when dtype_supported (moetrain
// has no tensor type for BOOL, I8, I16, U32, U64, F8_*, which the reader accepts but cannot return).
struct SafetensorsInfo {
    std::string dtype_name;
    core::DType dtype = core::DType::u8;
    bool dtype_supported = false;
    size_t element_size = 0;
    core::Shape shape;
    uint64_t begin = 0;  // byte offsets into the data buffer, end exclusive
    uint64_t end = 0;
};

// A validated, memory-mapped safetensors file. The constructor checks the whole header (length, JSON object,
// unique keys, string metadata, known dtypes, offsets that match shapes and cover the buffer with no holes or
// overlaps) and fails with one Error naming the file (and the tensor) otherwise.
class SafetensorsFile {
   public:
    // @param[in] path  the file to open
    // @param[in] code  exit code of every Error this object throws (checkpoint = 4 by default; 3 for input data)
    explicit SafetensorsFile(const std::string& path, core::ExitCode code = core::ExitCode::checkpoint);

    const std::string& path() const {
        return path_;
    }
    // Tensor names, sorted.
    std::vector<std::string> keys() const;
    bool has(const std::string& name) const {
        return entries_.count(name) != 0;
    }
    // The header entry of a tensor; fails naming the tensor and the file when it is absent.
    const SafetensorsInfo& info(const std::string& name) const;
    const std::map<std::string, std::string>& metadata() const {
        return metadata_;
    }
    // A new contiguous CPU tensor holding a copy of the named tensor, in the file's dtype.
    core::Tensor read(const std::string& name) const;
    // Copies the named tensor into dst (CPU, any strides), converting the dtype when dst's differs (BF16 file ->
    // f32 dst and so on). Fails naming the tensor, the file and both shapes when the shapes differ.
    // @param[out] dst  the destination view; its shape must equal the stored one
    void read_into(const std::string& name, const core::Tensor& dst) const;
    // The raw little-endian bytes of a tensor inside the map (valid while this object lives).
    const uint8_t* raw_bytes(const std::string& name) const;

   private:
    void parse_header();
    std::string path_;
    core::ExitCode code_;
    std::unique_ptr<core::MappedFile> map_;
    uint64_t data_start_ = 0;
    std::map<std::string, SafetensorsInfo> entries_;
    std::map<std::string, std::string> metadata_;
};

}  // namespace mt::train
