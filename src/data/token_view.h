// A flat, read-only run of token ids in one element type (the payload of an llm.c shard or a Megatron .bin),
// as the readers expose it to TokenSource.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

namespace mt::data {

enum class TokenType : uint8_t { u8, i8, i16, u16, i32, u32, i64 };

inline size_t token_type_size(TokenType t) {
    switch (t) {
        case TokenType::u8:
        case TokenType::i8:
            return 1;
        case TokenType::i16:
        case TokenType::u16:
            return 2;
        case TokenType::i32:
        case TokenType::u32:
            return 4;
        case TokenType::i64:
            return 8;
    }
    return 0;
}

std::string_view token_type_name(TokenType t);

struct TokenView {
    const uint8_t* data = nullptr;  // little-endian elements; may be unaligned
    int64_t count = 0;
    TokenType type = TokenType::u16;
};

// Element i of the view, widened to int64 (unaligned-safe).
inline int64_t token_view_get(const TokenView& v, int64_t i) {
    const uint8_t* p = v.data + static_cast<size_t>(i) * token_type_size(v.type);
    switch (v.type) {
        case TokenType::u8:
            return *p;
        case TokenType::i8:
            return static_cast<int8_t>(*p);
        case TokenType::i16: {
            int16_t x;
            std::memcpy(&x, p, 2);
            return x;
        }
        case TokenType::u16: {
            uint16_t x;
            std::memcpy(&x, p, 2);
            return x;
        }
        case TokenType::i32: {
            int32_t x;
            std::memcpy(&x, p, 4);
            return x;
        }
        case TokenType::u32: {
            uint32_t x;
            std::memcpy(&x, p, 4);
            return x;
        }
        case TokenType::i64: {
            int64_t x;
            std::memcpy(&x, p, 8);
            return x;
        }
    }
    return 0;
}

}  // namespace mt::data
