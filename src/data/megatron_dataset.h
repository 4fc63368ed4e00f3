// Megatron-LM indexed datasets (conventions §4.2): PREFIX.idx (magic "MMIDIDX", version, dtype, sequence lengths,
// byte pointers, document indices) and PREFIX.bin (raw tokens in the idx dtype). Both are memory-mapped.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "core/file_util.h"
#include "data/token_view.h"

namespace mt::data {

// dtype codes of the .idx header (Megatron's DType enum).
enum class MegatronDType : uint8_t { u8 = 1, i8 = 2, i16 = 3, i32 = 4, i64 = 5, f64 = 6, f32 = 7, u16 = 8 };

// Megatron's choice: uint16 when the vocab fits, else int32.
MegatronDType megatron_dtype_for_vocab(int64_t vocab_size);

// Writes PREFIX.bin and PREFIX.idx atomically, one sequence (= one document) per entry of sequence_lengths.
// @param[in] prefix            output path without extension
// @param[in] tokens            all tokens, sequences back to back
// @param[in] sequence_lengths  token count of each sequence; they must sum to tokens.size()
// @param[in] dtype             element type of the .bin (an integer type)
void megatron_write_dataset(const std::string& prefix,
                            std::span<const int32_t> tokens,
                            std::span<const int64_t> sequence_lengths,
                            MegatronDType dtype);

// A dataset mapped read-only. Accepts PREFIX, PREFIX.bin or PREFIX.idx. The constructor validates the .idx
// (magic, version, dtype, exact size, document indices, contiguous pointers) and the .bin size, throwing
// Error(ExitCode::data) naming the file.
class MegatronDataset {
   public:
    explicit MegatronDataset(const std::string& path);

    const std::string& prefix() const {
        return prefix_;
    }
    std::string bin_path() const {
        return prefix_ + ".bin";
    }
    std::string idx_path() const {
        return prefix_ + ".idx";
    }
    MegatronDType dtype() const {
        return dtype_;
    }
    int64_t num_sequences() const {
        return num_sequences_;
    }
    int64_t num_documents() const {
        return num_documents_;
    }
    int64_t num_tokens() const {
        return view_.count;
    }
    int64_t sequence_length(int64_t i) const;
    int64_t sequence_pointer(int64_t i) const;  // bytes into .bin
    int64_t document_index(int64_t d) const;    // d in [0, num_documents]
    // The sequence holding flat token index t (0 <= t < num_tokens).
    int64_t sequence_of_token(int64_t t) const;
    // All tokens of the .bin, sequences back to back.
    const TokenView& tokens() const {
        return view_;
    }
    // Fails with exit 3 naming the file when the .idx or the .bin changed on disk since they were mapped.
    void check_unchanged() const {
        idx_->check_unchanged();
        bin_->check_unchanged();
    }

   private:
    std::string prefix_;
    std::unique_ptr<core::MappedFile> idx_;
    std::unique_ptr<core::MappedFile> bin_;
    MegatronDType dtype_ = MegatronDType::u16;
    int64_t num_sequences_ = 0;
    int64_t num_documents_ = 0;
    size_t lengths_off_ = 0, pointers_off_ = 0, docs_off_ = 0;
    TokenView view_;
};

}  // namespace mt::data
