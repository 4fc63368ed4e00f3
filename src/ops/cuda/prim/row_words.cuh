// Row copies by words (pixel_shuffle, splice_rows): a kernel that moves whole rows between two tensors reads and
// writes them in the widest word that the row's bytes and both base pointers allow, so a bf16 row of 1152 values
// moves as 144 16-byte words instead of 1152 2-byte ones.
#pragma once

#include <vector_types.h>

#include <cstdint>

namespace mt::ops::cuda {

// The widest word (16, 8, 4 or 2 bytes) that divides a row's bytes and both pointers' alignment.
inline int row_word_bytes(int64_t row_bytes, const void* a, const void* b) {
    for (int bytes : {16, 8, 4, 2}) {
        if (row_bytes % bytes == 0 && reinterpret_cast<uintptr_t>(a) % bytes == 0 &&
            reinterpret_cast<uintptr_t>(b) % bytes == 0)
            return bytes;
    }
    return 2;  // every CUDA dtype is at least 2 bytes, and tensors are at least element-aligned
}

// Calls launch(W{}) with the word type of that many bytes (uint4, uint2, uint32_t, uint16_t).
template <typename Launch>
void with_row_word(int bytes, const Launch& launch) {
    if (bytes == 16)
        launch(uint4{});
    else if (bytes == 8)
        launch(uint2{});
    else if (bytes == 4)
        launch(uint32_t{});
    else
        launch(uint16_t{});
}

}  // namespace mt::ops::cuda
