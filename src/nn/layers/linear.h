// Linear layer without bias: y = x @ W^T, W [out, in] as in PyTorch. Under tensor parallelism a column-parallel
// linear holds out / tp of the output features (its rows of W), a row-parallel one in / tp of the input features
// (its columns of W; its output is a part of the sum over tp, which the region's edge reduces).
#pragma once

#include <string>

#include "nn/param_table.h"
#include "nn/tensor_parallel.h"

namespace mt::nn {

class Linear {
   public:
    Linear() = default;
    // column: this rank's output features; row: its input features; partial: the whole weight on every tp rank,
    // each holding a part of its gradient (a projection whose output feeds only this rank's heads).
    // kv_column: column-parallel over n_kv_heads shards, replicated when tp exceeds them (tp_split_replicated).
    enum class Split : uint8_t { none, column, row, partial, kv_column };
    // Declares `name`.weight [out, in] in the table (the global shape; this rank's shard under tp and a split).
    Linear(ParamTable& table,
           const std::string& name,
           int64_t in,
           int64_t out,
           double init_std,
           const TensorParallel& tp = {},
           Split split = Split::none,
           int64_t kv_parts = 1,
           int64_t head_rows = 0);

    // x: [N, in] -> y: [N, out]
    void forward(const Tensor& x, const Tensor& y) const;
    // dy: [N, out]; dx [N, in] written (=), or added to with accumulate_dx (+=), skipped when undefined; dW
    // accumulates (its first write of a step writes: ParamTable::first_grad_write).
    void backward(const Tensor& x, const Tensor& dy, const Tensor& dx, bool accumulate_dx = false) const;

    Tensor weight() const {
        return table_->param(index_);
    }
    int index() const {
        return index_;
    }

   private:
    ParamTable* table_ = nullptr;
    int index_ = -1;
};

}  // namespace mt::nn
