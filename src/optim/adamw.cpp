// AdamW over the parameter table.
#include "optim/adamw.h"

namespace mt::optim {

AdamW::AdamW(nn::ParamTable& table, const ops::AdamWHyper& hyper) : table_(&table), hyper_(hyper) {
    m_ = table.make_arena(table.precision().master);
    v_ = table.make_arena(table.precision().master);
}

void AdamW::step(double lr, int64_t step, double grad_scale) {
    for (int i = 0; i < table_->size(); ++i) {
        ops::AdamWHyper h = hyper_;
        h.lr = lr;
        if (!table_->spec(i).weight_decay) h.weight_decay = 0.0;
        auto flat = [](const core::Tensor& t) { return t.reshape({t.numel()}); };
        // Under mixed precision the same kernel also writes the forward's bf16 copy of the weights.
        const core::Tensor copy = table_->precision().has_master_copy() ? flat(table_->param(i)) : core::Tensor();
        ops::adamw_step(
            flat(table_->master(i)), flat(table_->grad(i)), flat(m(i)), flat(v(i)), h, step, grad_scale, copy);
    }
}

}  // namespace mt::optim
