// Linear layer over ops::linear.
#include "nn/layers/linear.h"

#include "ops/linear.h"

namespace mt::nn {

Linear::Linear(ParamTable& table,
               const std::string& name,
               int64_t in,
               int64_t out,
               double init_std,
               const TensorParallel& tp,
               Split split,
               int64_t kv_parts,
               int64_t head_rows)
    : table_(&table) {
    // A hidden matrix: Muon's under optim.name = "muon" (the embedding and the LM head are not nn::Linear).
    ParamSpec spec{.name = name + ".weight",
                   .shape = {out, in},
                   .init = InitKind::normal,
                   .init_std = init_std,
                   .group = OptimGroup::muon,
                   .head_rows = head_rows};
    if (split == Split::partial)
        spec = tp_partial(std::move(spec), tp);
    else if (split == Split::kv_column)
        spec = tp_split_replicated(std::move(spec), tp, 0, kv_parts);
    else if (split != Split::none)
        spec = tp_split(std::move(spec), tp, split == Split::column ? 0 : 1);
    index_ = table.add(std::move(spec));
    table.set_grad_written_whole(index_);  // backward's first write of a step writes all of dW
}

void Linear::forward(const Tensor& x, const Tensor& y) const {
    ops::linear_fwd(x, table_->param(index_), Tensor(), y);
}

void Linear::backward(const Tensor& x, const Tensor& dy, const Tensor& dx, bool accumulate_dx) const {
    // The step's first gradient of W is written, not added to its zeros (ParamTable::first_grad_write).
    const bool accumulate_dw = !table_->first_grad_write(index_);
    ops::linear_bwd(x, table_->param(index_), dy, dx, table_->grad(index_), Tensor(), accumulate_dx, accumulate_dw);
}

}  // namespace mt::nn
