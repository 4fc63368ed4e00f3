// Linear layer without bias: y = x @ W^T, W [out, in] as in PyTorch.
#pragma once

#include <string>

#include "nn/param_table.h"

namespace mt::nn {

class Linear {
   public:
    Linear() = default;
    // Declares `name`.weight [out, in] in the table.
    Linear(ParamTable& table, const std::string& name, int64_t in, int64_t out, double init_std);

    // x: [N, in] -> y: [N, out]
    void forward(const Tensor& x, const Tensor& y) const;
    // dy: [N, out]; dx [N, in] written (=), or added to with accumulate_dx (+=), skipped when undefined; dW
    // accumulates.
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
