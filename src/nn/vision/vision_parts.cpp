// nn.Linear and nn.LayerNorm over ops::linear and ops::layernorm.
#include "nn/vision/vision_parts.h"

#include "ops/layernorm.h"
#include "ops/linear.h"

namespace mt::nn {

namespace {
int add_zero_vector(ParamTable& table, const std::string& name, int64_t dim, InitKind init = InitKind::zeros) {
    return table.add({.name = name, .shape = {dim}, .init = init, .weight_decay = false});
}
}  // namespace

BiasedLinear::BiasedLinear(ParamTable& table,
                           const std::string& name,
                           int64_t in,
                           int64_t out,
                           double init_std,
                           OptimGroup group,
                           int64_t head_rows)
    : table_(&table) {
    weight_ = table.add({.name = name + ".weight",
                         .shape = {out, in},
                         .init = InitKind::normal,
                         .init_std = init_std,
                         .group = group,
                         .head_rows = head_rows});
    bias_ = add_zero_vector(table, name + ".bias", out);
}

void BiasedLinear::forward(const Tensor& x, const Tensor& y) const {
    ops::linear_fwd(x, table_->param(weight_), table_->param(bias_), y);
}

void BiasedLinear::backward(const Tensor& x, const Tensor& dy, const Tensor& dx, bool accumulate_dx) const {
    ops::linear_bwd(x, table_->param(weight_), dy, dx, table_->grad(weight_), table_->grad(bias_), accumulate_dx);
}

LayerNorm::LayerNorm(ParamTable& table, const std::string& name, int64_t dim, double eps)
    : table_(&table),
      weight_(add_zero_vector(table, name + ".weight", dim, InitKind::ones)),
      bias_(add_zero_vector(table, name + ".bias", dim)),
      eps_(eps) {}

void LayerNorm::forward(const Tensor& x, const Tensor& y, const Tensor& mean, const Tensor& rstd) const {
    ops::layernorm_fwd(x, table_->param(weight_), table_->param(bias_), eps_, y, mean, rstd);
}

void LayerNorm::backward(const Tensor& x,
                         const Tensor& mean,
                         const Tensor& rstd,
                         const Tensor& dy,
                         const Tensor& dx,
                         const Tensor& dresidual) const {
    ops::layernorm_bwd(
        x, table_->param(weight_), mean, rstd, dy, dx, table_->grad(weight_), table_->grad(bias_), dresidual);
}

}  // namespace mt::nn
