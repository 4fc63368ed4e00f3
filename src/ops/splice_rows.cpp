// Entry points of splice_rows (the image embeddings spliced into the token sequence): argument checks, including the
// values of a host index (in range, distinct), and dispatch by device.
#include "ops/splice_rows.h"

#include <vector>

#include "ops/cpu/checks.h"
#include "ops/registry.h"

namespace mt::ops {

namespace {

// rows: [M, C] (src or dsrc), index [M] i32, seq [N, C] (x or dx), all on one device; a host index in [0, N) with
// distinct entries. Returns the device.
core::Device check_splice_rows_args(const Tensor& rows,
                                    std::string_view rows_arg,
                                    const Tensor& index,
                                    const Tensor& seq,
                                    std::string_view seq_arg,
                                    std::string_view op) {
    check_arg(seq, op, seq_arg, 2);
    check_arg(rows, op, rows_arg, 2);
    cpu::check_i32_arg(index, op, "index", 1);
    const int64_t m = index.size(0), n = seq.size(0);
    check_shape(rows, {m, seq.size(1)}, op, rows_arg);
    const core::Device device = check_same_device(op, {{seq_arg, seq}, {rows_arg, rows}});
    MT_CHECK(index.device() == device,
             "{}: index is on the {} but {} is on the {}",
             op,
             core::device_name(index.device()),
             seq_arg,
             core::device_name(device));
    MT_CHECK(rows.numel() == 0 || rows.raw() != seq.raw(), "{}: {} must not alias {}", op, rows_arg, seq_arg);
    cpu::check_index_range(index, 0, n, op, "index");
    if (index.device() == core::Device::cpu) {
        const int32_t* v = index.data<int32_t>();
        std::vector<int64_t> first(static_cast<size_t>(n), -1);  // the position of each row's first entry
        for (int64_t i = 0; i < m; ++i) {
            MT_CHECK(first[v[i]] < 0,
                     "{}: index[{}] = index[{}] = {}; the entries must be distinct",
                     op,
                     first[v[i]],
                     i,
                     v[i]);
            first[v[i]] = i;
        }
    }
    return device;
}

}  // namespace

void splice_rows_fwd(const Tensor& src, const Tensor& index, const Tensor& x) {
    constexpr std::string_view op = "splice_rows_fwd";
    MT_CALL_KERNEL(splice_rows_fwd, check_splice_rows_args(src, "src", index, x, "x", op), src, index, x);
}

void splice_rows_bwd(const Tensor& index, const Tensor& dx, const Tensor& dsrc) {
    constexpr std::string_view op = "splice_rows_bwd";
    MT_CALL_KERNEL(splice_rows_bwd, check_splice_rows_args(dsrc, "dsrc", index, dx, "dx", op), index, dx, dsrc);
}

}  // namespace mt::ops
