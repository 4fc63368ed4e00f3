// Per-row loss weights of the model's loss (Model::set_row_loss_weights; multimodal.md §5): the weighted sum the
// forward returns and the weighted per-token gradient the cross-entropy's backward scales each row's dlogits by.
#include "nn/model.h"

namespace mt::nn {

double Model::weighted_loss_sum(const Tensor& losses) const {
    const int64_t n = batch_ * seq_;
    MT_CHECK(std::ssize(row_loss_weights_) == batch_,
             "{} row loss weights for a batch of {} rows",
             row_loss_weights_.size(),
             batch_);
    // Each row's tokens summed in order, then weighted: the plain path's order within a row.
    const int32_t* t = host_targets_.data<int32_t>();
    double sum = 0.0;
    for (int64_t b = 0; b < batch_; ++b) {
        double row = 0.0;
        for (int64_t i = b * seq_; i < (b + 1) * seq_ && i < n; ++i)
            if (t[i] != kIgnoreIndex) row += core::tensor_get_flat(losses, i);
        sum += row_loss_weights_[static_cast<size_t>(b)] * row;
    }
    return sum;
}

void Model::fill_weighted_dlosses(double scale) {
    const int64_t n = batch_ * seq_;
    MT_CHECK(std::ssize(row_loss_weights_) == batch_ && losses_.numel() == n,
             "{} row loss weights for a batch of {} rows ({} loss rows)",
             row_loss_weights_.size(),
             batch_,
             losses_.numel());
    // d(scale x sum_b w_b sum_t loss_bt / counted)/d(loss_bt) = scale w_b / counted (the op zeroes ignored rows).
    const double unit = counted_ > 0 ? scale / static_cast<double>(counted_) : 0.0;
    Tensor host = Tensor::zeros({n}, core::DType::f64);
    double* d = host.data<double>();
    for (int64_t i = 0; i < n; ++i) d[i] = unit * row_loss_weights_[static_cast<size_t>(i / seq_)];
    losses_.copy_from(host.to(losses_.dtype()).to_device(losses_.device()));
}

}  // namespace mt::nn
