// The packed layout of KDA's document masking (cpu/kda_pack.h): the host maps (the row gather that packs and unpacks
// through them is in ops/kda.cpp, since it runs another op).
#include "ops/cpu/kda_pack.h"

#include <algorithm>
#include <limits>

namespace mt::ops::cpu {

KdaPackPlan kda_pack_plan(const Tensor& doc_start, int64_t chunk) {
    KdaPackPlan p;
    p.b = doc_start.size(0);
    p.t = doc_start.size(1);
    p.chunk = chunk;
    const int32_t* ds = doc_start.data<int32_t>();
    auto padded = [chunk](int64_t len) { return (len + chunk - 1) / chunk * chunk; };
    // Packed length of each row: its documents each rounded up to whole chunks.
    std::vector<int64_t> row_len(static_cast<size_t>(p.b), 0);
    for (int64_t row = 0; row < p.b; ++row) {
        const int32_t* d = ds + row * p.t;
        for (int64_t i = 0; i < p.t; ++i) {
            if (d[i] != i) continue;  // not a document start
            int64_t end = i + 1;
            while (end < p.t && d[end] != end) ++end;
            row_len[static_cast<size_t>(row)] += padded(end - i);
            ++p.documents;
        }
    }
    p.tp = *std::max_element(row_len.begin(), row_len.end());
    p.nc = p.tp / chunk;
    MT_CHECK(p.b * p.tp < std::numeric_limits<int32_t>::max(),
             "kda: the packed documents take {} rows of {} tokens, beyond 32-bit row indices",
             p.b,
             p.tp);
    p.src.assign(static_cast<size_t>(p.b * p.tp), -1);
    p.dst.assign(static_cast<size_t>(p.b * p.t), -1);
    p.reset.assign(static_cast<size_t>(p.b * p.nc), 0);
    for (int64_t row = 0; row < p.b; ++row) {
        const int32_t* d = ds + row * p.t;
        int64_t start = 0;  // packed position of the current document's first token
        for (int64_t i = 0; i < p.t; ++i) {
            if (d[i] == i && i > 0) {
                // A new document: the previous one took start + (i - d[i - 1]) tokens, rounded up to whole chunks.
                start += padded(i - d[i - 1]);
                p.reset[static_cast<size_t>(row * p.nc + start / chunk)] = 1;
            }
            const int64_t pos = start + (i - d[i]);
            p.src[static_cast<size_t>(row * p.tp + pos)] = static_cast<int32_t>(row * p.t + i);
            p.dst[static_cast<size_t>(row * p.t + i)] = static_cast<int32_t>(row * p.tp + pos);
        }
    }
    return p;
}

}  // namespace mt::ops::cpu
