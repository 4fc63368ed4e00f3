// The model's forward and backward (attention, KDA, MoE and AttnRes blocks), written as explicit per-layer calls (as
// llm.c's gpt2_forward/backward).
#include "nn/model.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include "core/trace.h"
#include "nn/layer_stats.h"
#include "ops/argmax.h"
#include "ops/cross_entropy.h"
#include "ops/embedding.h"
#include "ops/linear.h"
#include "ops/rmsnorm.h"
#include "parallel/comm.h"

namespace mt::nn {

Model::Model(const ModelConfig& cfg,
             const Precision& precision,
             int64_t param_align,
             const MoeExpertParallel& ep,
             const TensorParallel& tp,
             const ModelPart& part,
             bool allocate,
             const ContextParallel& cp)
    : cfg_(cfg), precision_(precision), tp_(tp), cp_(cp), part_(part) {
    MT_CHECK(!cfg.layer_pattern.empty() && cfg.layer_pattern.find_first_not_of("AK") == std::string::npos &&
                 cfg.n_layers % static_cast<int64_t>(cfg.layer_pattern.size()) == 0,
             "model.layer_pattern `{}` must be letters A and K, its length dividing model.n_layers = {}",
             cfg.layer_pattern,
             cfg.n_layers);
    if (part_.chunks.empty()) part_.chunks = {{0, cfg.n_layers}};
    bool embedding = false, head = false;
    for (const auto& [first, last] : part_.chunks) {
        MT_CHECK(0 <= first && first < last && last <= cfg.n_layers,
                 "model chunk [{}, {}) outside the {} layers",
                 first,
                 last,
                 cfg.n_layers);
        embedding = embedding || first == 0;
        head = head || last == cfg.n_layers;
    }
    // Vocab-parallel: the embedding and the head hold this rank's rows of the vocabulary. A tied head is the
    // embedding: the last stage of a pipeline holds a copy of it.
    if (embedding || (head && cfg.tie_embeddings))
        embed_ = table_.add(tp_split(
            {.name = "embed.weight", .shape = {cfg.vocab_size, cfg.d_model}, .init_std = cfg.init_std}, tp, 0));
    // The vision tower sits with the embedding (the chunk of layer 0: the first pipeline stage), its parameters before
    // every block's: the gradient hooks that report blocks complete never claim them before the splice's backward, and
    // the forward waits for them (ZeRO-1's gathers) with the embedding's.
    if (embedding && cfg.vision.enabled()) vision_ = std::make_unique<VisionEncoder>(table_, cfg.vision, cfg.d_model);
    input_params_end_ = table_.size();
    std::vector<int64_t> layers;
    for (const auto& [first, last] : part_.chunks) {
        chunk_begin_.push_back(static_cast<int64_t>(layers.size()));
        for (int64_t l = first; l < last; ++l) layers.push_back(l);
    }
    chunk_begin_.push_back(static_cast<int64_t>(layers.size()));
    for (int64_t l : layers) {
        block_layer_.push_back(l);
        block_first_param_.push_back(table_.size());
        blocks_.push_back(std::make_unique<Block>(table_,
                                                  "layers." + std::to_string(l),
                                                  cfg,
                                                  cfg.layer_is_kda(l)      ? Mixer::kda
                                                  : cfg.layer_is_window(l) ? Mixer::window_attention
                                                                           : Mixer::attention,
                                                  cfg.layer_is_moe(l),
                                                  ep,
                                                  tp,
                                                  cp));
    }
    for (auto& b : blocks_) moe_modality_ = moe_modality_ || (b->moe() != nullptr && b->moe()->per_modality());
    // long.offload_kv: each global attention layer stages the next one's keys in the forward, the previous one's in
    // the backward.
    std::vector<AttentionLayer*> attention;  // the global ones: window layers keep only small snapshots
    for (auto& b : blocks_)
        if (b->mixer() == Mixer::attention) attention.push_back(b->attention());
    for (size_t i = 0; i < attention.size(); ++i)
        attention[i]->link_offload(i + 1 < attention.size() ? attention[i + 1] : nullptr,
                                   i > 0 ? attention[i - 1] : nullptr);
    if (cfg.attnres.enabled()) {
        attnres_ = std::make_unique<AttnResStack>(table_, cfg, tp, part_);
        layer_block_.assign(static_cast<size_t>(cfg.n_layers), nullptr);
        for (size_t i = 0; i < blocks_.size(); ++i)
            layer_block_[static_cast<size_t>(block_layer_[i])] = blocks_[i].get();
    }
    if (head)
        final_norm_ = table_.add(tp_partial(
            {.name = "final_norm.weight", .shape = {cfg.d_model}, .init = InitKind::ones, .weight_decay = false},
            tp.splits_rows() ? tp : TensorParallel{}));
    if (head && !cfg.tie_embeddings)
        lm_head_ = table_.add(tp_split(
            {.name = "lm_head.weight", .shape = {cfg.vocab_size, cfg.d_model}, .init_std = cfg.init_std}, tp, 0));
    if (allocate)
        table_.finalize(precision, param_align);
    else
        table_.layout(precision, param_align);
}

ParamTable Model::param_layout(const ModelConfig& cfg,
                               const Precision& precision,
                               int64_t param_align,
                               const MoeExpertParallel& ep,
                               const TensorParallel& tp,
                               const ModelPart& part) {
    Model declared(cfg, precision, param_align, ep, tp, part, false);
    return std::move(declared.table_);  // the layers' pointers into it die with `declared`; the table needs none
}

void Model::resize(int64_t batch, int64_t seq) {
    if (batch == batch_ && seq == seq_) return;
    batch_ = batch;
    seq_ = seq;
    const int64_t n = batch * seq, stream = tp_.stream_rows(n);
    MT_CHECK(!tp_.splits_rows() || n % tp_.size == 0,
             "sequence parallelism over {} ranks needs batch x seq = {} x {} divisible by it",
             tp_.size,
             batch,
             seq);
    const core::Device dev = precision_.device;
    const core::DType act = precision_.compute, stats = precision_.stats;
    ids_ = Tensor::zeros({n}, core::DType::i32, dev);
    targets_ = Tensor::zeros({n}, core::DType::i32, dev);
    host_targets_ = Tensor::zeros({n}, core::DType::i32);
    chunk_in_.clear();
    for (int c = 0; c < num_chunks(); ++c) chunk_in_.push_back(Tensor::zeros({stream, cfg_.d_model}, act, dev));
    x0_ = chunk_in_[static_cast<size_t>(chunk_)];
    final_ = Tensor::zeros({stream, cfg_.d_model}, act, dev);
    final_full_ = tp_.splits_rows() ? Tensor::zeros({n, cfg_.d_model}, act, dev) : Tensor();
    final_rstd_ = Tensor::zeros({stream}, stats, dev);
    // The LM head's buffers only where the head is (the last pipeline stage).
    logits_ = final_norm_ >= 0 ? Tensor::zeros({cfg_.loss_chunk_rows(n), vocab_rows()}, act, dev) : Tensor();
    losses_ = Tensor::zeros({n}, stats, dev);
    lse_ = Tensor::zeros({n}, stats, dev);
    dres_a_ = Tensor::zeros({stream, cfg_.d_model}, act, dev);
    dres_b_ = Tensor::zeros({stream, cfg_.d_model}, act, dev);
    ws_.resize(cfg_, batch, seq, precision_);
    for (size_t l = 0; l < blocks_.size(); ++l) {
        blocks_[l]->resize(batch, seq, precision_);
        blocks_[l]->reserve_scratch(ws_);
        // Recompute full: the forward allocates a block's activations when it runs it, so that the first step does not
        // hold every block's at once (the later steps never do).
        if (full_recompute()) blocks_[l]->release_activations(!keeps_output(static_cast<int64_t>(l)));
    }
    if (attnres_) attnres_->resize(stream, precision_);
}

double Model::forward(const Tensor& ids, const Tensor& targets, bool training) {
    MT_CHECK(num_chunks() == 1 && chunk_has_embedding(0) && chunk_has_head(0),
             "Model::forward runs the whole model; a pipeline part runs forward_chunk");
    if (graphs_.enabled && training && graph_blocker().empty()) {
        const std::vector<int64_t> shape = {ids.size(0), ids.size(1), static_cast<int64_t>(cfg_.rope_theta)};
        if (graphs_.warm && shape != graphs_.shape) drop_graphs();  // a new shape warms up again
        if (graphs_.warm) return graph_forward(ids, targets);
        // The first step runs eagerly (lazy kernel loading, library handles, algorithm caches, RoPE tables); its
        // backward makes the model warm.
        const double loss = forward_chunk(0, ids, targets, Tensor(), training, /*recompute=*/false);
        graphs_.warming = true;
        graphs_.shape = shape;
        return loss;
    }
    return forward_chunk(0, ids, targets, Tensor(), training, /*recompute=*/false);  // the one chunk of every layer
}

double Model::pass_forward() {
    const bool head = pass_forward_kernels();
    collect_max_logits();
    return head ? pass_loss() : 0.0;
}

bool Model::pass_forward_kernels() {
    const core::Device dev = precision_.device;
    for (auto& b : blocks_) b->set_backward_phase(false);
    const int all = table_.size();
    // ZeRO's parameter gathers are waited for once, in the first pass.
    auto need = [&](int end) {
        if (params_needed_ && pass_ == 0) params_needed_(end);
    };
    // Under AttnRes the stack drives the blocks (and has parameters of its own): everything up front.
    need(attnres_ ? all : input_params_end_);
    if (chunk_has_embedding(chunk_)) {
        core::TraceRange range(dev, "model.embed_fwd");
        // Vocab-parallel: each rank looks up the ids in its rows (zeros elsewhere) and the sum over tp completes it.
        const Tensor rows = tp_.splits_rows() ? Tensor::scratch({ids_.numel(), cfg_.d_model}, x0_.dtype(), dev) : x0_;
        ops::embedding_fwd(ids_, vocab_part(table_.param(embed_)), rows, vocab_shard());
        tp_sum_rows(tp_, rows, x0_);
        vision_forward();
    }
    const Tensor* x = &x0_;
    if (attnres_) {
        attnres_->forward(attnres_pass(), x0_, layer_block_, ws_);
        x = &attnres_->forward_output();
    } else {
        const auto lo = static_cast<size_t>(chunk_lo()), hi = static_cast<size_t>(chunk_hi());
        for (size_t l = lo; l < hi; ++l) {
            need(l + 1 < blocks_.size() ? block_first_param_[l + 1] : all);
            if (full_recompute()) blocks_[l]->restore_activations();
            blocks_[l]->forward(*x, ws_);
            x = &blocks_[l]->output();
            if (!full_recompute()) continue;
            blocks_[l]->release_activations(false);
            if (l > lo && !keeps_output(static_cast<int64_t>(l) - 1)) blocks_[l - 1]->release_output();
        }
    }
    if (!chunk_has_head(chunk_)) return false;  // a pipeline chunk's output goes to the next stage
    need(all);
    const int64_t n = batch_ * seq_;
    {
        core::TraceRange range(dev, "model.head_fwd");
        ops::rmsnorm_fwd(*x, table_.param(final_norm_), cfg_.norm_eps, final_, final_rstd_);
        if (tp_.splits_rows()) tp_gather_rows(tp_, final_, final_full_);
        if (track_predictions_) {
            MT_CHECK(!tp_.active() && !cp_.active() && bounds_.size() == 2,
                     "greedy predictions need one pass on one rank's whole vocabulary (no tp, cp or segments)");
            if (!predictions_.defined() || predictions_.numel() != n || predictions_.device() != dev)
                predictions_ = Tensor::zeros({n}, core::DType::i32, dev);
        }
        const int64_t rows = cfg_.loss_chunk_rows(n);
        for (int64_t first = 0; first < n; first += rows) head_chunk_forward(first, std::min(rows, n - first));
        if (tp_.active()) combine_vocab_shards();
    }
    return true;
}

double Model::pass_loss() {
    const int64_t n = batch_ * seq_;
    // Summed on the host in f64, in row order (deterministic on every device).
    const Tensor losses = losses_.device() == core::Device::cpu ? losses_ : losses_.to_device(core::Device::cpu);
    // The whole sequence's per-token losses (last_token_losses): this segment's rows, or every cp rank's.
    const auto j = static_cast<size_t>(pass_);
    const int64_t pass_first = bounds_[j], pass_len = bounds_[j + 1] - bounds_[j];
    if (seq_losses_.defined()) {
        Tensor pass = losses.reshape({batch_, seq_});
        if (cp_.active()) {
            pass = Tensor::scratch({batch_, pass_len}, losses.dtype(), core::Device::cpu);
            cp_gather_rows(cp_, losses.reshape({batch_, seq_}), pass);
        }
        copy_time_rows(seq_losses_.reshape({batch_, total_seq_}), pass_first, pass, 0, pass_len);
    }
    double sum = 0.0;
    const int32_t* t = host_targets_.data<int32_t>();
    if (!row_loss_weights_.empty()) sum = weighted_loss_sum(losses);
    for (int64_t i = 0; i < n && row_loss_weights_.empty(); ++i)
        if (t[i] != kIgnoreIndex) sum += core::tensor_get_flat(losses, i);
    // Context parallelism: the loss of the whole sequence, summed over the group's tokens (counted_ counts them all).
    return cp_.active() ? parallel::comm_all_reduce_sum(cp_.group(), sum) : sum;
}

void Model::backward(double loss_scale) {
    if (graphs_.forward_ran) {
        graph_backward(loss_scale);
        return;
    }
    backward_chunk(loss_scale, Tensor());
    graphs_.warm = graphs_.warm || graphs_.warming;
}

void Model::pass_backward(double loss_scale, bool last_pass, const Tensor& d_output) {
    if (chunk_has_head(chunk_)) fill_dlosses(loss_scale);
    pass_backward_kernels(loss_scale, last_pass, d_output);
    // The gradients zero_grads left that this backward did not write. With several pipeline chunks on this rank the
    // trainer settles after all their backwards instead: another chunk's gradients may not be written yet.
    if (last_pass && num_chunks() == 1) table_.settle_grads();
}

void Model::pass_backward_kernels(double loss_scale, bool last_pass, const Tensor& d_output) {
    const core::Device dev = precision_.device;
    for (auto& b : blocks_) b->set_backward_phase(true);
    // A parameter's gradient is complete only after the last pass: data parallelism hears of it then.
    const GradReadyHook none;
    // Before data parallelism reads them, the complete gradients that zero_grads left and no layer wrote are zeroed.
    const GradReadyHook settled = [this](int first) {
        table_.settle_grads(first);
        grad_ready_(first);
    };
    const GradReadyHook& grad_ready = last_pass && grad_ready_ ? settled : none;
    if (chunk_has_head(chunk_)) {
        head_backward();
        // Everything declared after the blocks is complete now, except under AttnRes (its own parameters finish
        // with the blocks' backward, which it drives).
        if (grad_ready && !attnres_) grad_ready(final_norm_);
    } else if (d_output.defined()) {
        dres_a_.copy_from(d_output);  // a pipeline chunk: the next stage's gradient of this chunk's output
    }

    Tensor* dout = &dres_a_;
    Tensor* dx = &dres_b_;
    if (attnres_) {
        attnres_->backward(attnres_pass(), x0_, layer_block_, *dout, *dx, ws_);
        std::swap(dout, dx);
    }
    for (auto& [l, moe] : moe_layers()) moe->set_aux_grad_scale(loss_scale);
    const int64_t group = cfg_.recompute.group_size(cfg_.n_layers), lo = chunk_lo();
    for (int64_t l = attnres_ ? -1 : chunk_hi() - 1; l >= lo; --l) {
        if (full_recompute()) {
            const int64_t first = lo + (l - lo) / group * group;
            group_backward(first, l, dout, dx, grad_ready);
            l = first;
            continue;
        }
        const Tensor& input = l == lo ? x0_ : blocks_[static_cast<size_t>(l - 1)]->output();
        blocks_[static_cast<size_t>(l)]->backward(input, *dout, *dx, ws_);
        std::swap(dout, dx);
        // Block l's parameters are complete (the embedding, below every block, waits for its own backward).
        if (grad_ready) grad_ready(block_first_param_[static_cast<size_t>(l)]);
    }
    if (!chunk_has_embedding(chunk_)) {
        input_grad_ = *dout;  // for the previous stage
        return;
    }
    core::TraceRange range(dev, "model.embed_bwd");
    Tensor d_embed = *dout;
    if (tp_.splits_rows()) {  // every row's gradient: each rank's vocabulary rows may be looked up anywhere
        d_embed = Tensor::scratch({ids_.numel(), cfg_.d_model}, dout->dtype(), dev);
        tp_gather_rows(tp_, *dout, d_embed);
    }
    vision_backward(d_embed);  // takes (and zeroes) the image slots' rows first
    ops::embedding_bwd(ids_, d_embed, vocab_part(table_.grad(embed_)), vocab_shard());
    if (grad_ready) grad_ready(0);
}

void Model::fill_dlosses(double loss_scale) {
    // d(loss_scale * mean)/d(loss_i) = loss_scale / counted for counted rows (the op zeroes ignored rows).
    if (row_loss_weights_.empty())
        losses_.fill(counted_ > 0 ? loss_scale / static_cast<double>(counted_) : 0.0);
    else
        fill_weighted_dlosses(loss_scale);
}

void Model::head_backward() {
    const core::TraceRange range(precision_.device, "model.head_bwd");
    // Last chunk first: its logits are still in logits_ from the forward (with one chunk, all of them); every
    // earlier chunk's logits are recomputed into the same buffer.
    const int64_t n = batch_ * seq_, rows = cfg_.loss_chunk_rows(n);
    for (int64_t first = n > 0 ? (n - 1) / rows * rows : -1; first >= 0; first -= rows)
        head_chunk_backward(first, std::min(rows, n - first), first + rows < n);
    // Vocab-parallel: each rank's d(final norm) is its vocabulary rows' part; summed over tp (into the stream rows).
    const Tensor d_final = tp_.splits_rows() ? ws_.d_tmp.slice(0, 0, final_.size(0)) : ws_.d_norm;
    tp_sum_rows(tp_, ws_.d_norm, d_final);
    const Tensor& last = attnres_ ? attnres_->forward_output() : last_output();
    ops::rmsnorm_bwd(last, table_.param(final_norm_), final_rstd_, d_final, dres_a_, table_.grad(final_norm_));
}

ops::VocabShard Model::vocab_shard() const {
    if (!tp_.active()) return {};
    return {.first = tp_.shard_first(cfg_.vocab_size), .total = cfg_.vocab_size};
}

int64_t Model::vocab_rows() const {
    // The embedding's or the head's rows (a pipeline stage may hold only one of them): the same split.
    return tp_.active() ? param_tp_real(table_.spec(embed_ >= 0 ? embed_ : lm_head_)) : cfg_.vocab_size;
}

Tensor Model::vocab_part(const Tensor& t) const {
    return t.slice(0, 0, vocab_rows());
}

void Model::head_chunk_forward(int64_t first, int64_t rows) {
    const Tensor head = vocab_part(table_.param(lm_head_ >= 0 ? lm_head_ : embed_));
    const Tensor logits = logits_.slice(0, 0, rows);
    const Tensor& h = final_full_.defined() ? final_full_ : final_;
    ops::linear_fwd(h.slice(0, first, first + rows), head, Tensor(), logits);
    ops::cross_entropy_fwd(logits,
                           targets_.slice(0, first, first + rows),
                           kIgnoreIndex,
                           losses_.slice(0, first, first + rows),
                           lse_.slice(0, first, first + rows),
                           vocab_shard());
    // Before any backward overwrites the logits with their gradient.
    if (track_predictions_) ops::argmax_rows(logits, predictions_.slice(0, first, first + rows));
}

void Model::combine_vocab_shards() {
    // Per row: lse = log sum_r exp(lse_r) over the shards, loss = lse - (the target's logit, held by one shard).
    const int64_t n = lse_.numel();
    const Tensor mine = lse_.to_device(core::Device::cpu).to(core::DType::f64);
    const Tensor target = losses_.to_device(core::Device::cpu).to(core::DType::f64);
    Tensor all = Tensor::zeros({tp_.size, n}, core::DType::f64);
    tp_.comm->all_gather(mine, all).wait();
    tp_.comm->all_reduce(target).wait();
    Tensor lse = Tensor::zeros({n}, core::DType::f64), loss = Tensor::zeros({n}, core::DType::f64);
    const double *parts = all.data<double>(), *t = target.data<double>();
    const int32_t* targets = host_targets_.data<int32_t>();
    for (int64_t i = 0; i < n; ++i) {
        double m = -std::numeric_limits<double>::infinity(), sum = 0.0;
        for (int64_t r = 0; r < tp_.size; ++r) m = std::max(m, parts[r * n + i]);
        for (int64_t r = 0; r < tp_.size; ++r) sum += std::exp(parts[r * n + i] - m);
        const double l = m + std::log(sum);
        lse.data<double>()[i] = l;
        loss.data<double>()[i] = targets[i] == kIgnoreIndex ? 0.0 : l - t[i];
    }
    lse_.copy_from(lse.to(lse_.dtype()));
    losses_.copy_from(loss.to(losses_.dtype()));
}

void Model::head_chunk_backward(int64_t first, int64_t rows, bool recompute_logits) {
    const int head = lm_head_ >= 0 ? lm_head_ : embed_;
    const Tensor& full = final_full_.defined() ? final_full_ : final_;
    const Tensor h = full.slice(0, first, first + rows), logits = logits_.slice(0, 0, rows);
    const Tensor weight = vocab_part(table_.param(head));
    if (recompute_logits) ops::linear_fwd(h, weight, Tensor(), logits);
    // dlogits in place; the losses rows hold d(loss)/d(loss_i).
    ops::cross_entropy_bwd(logits,
                           targets_.slice(0, first, first + rows),
                           lse_.slice(0, first, first + rows),
                           kIgnoreIndex,
                           losses_.slice(0, first, first + rows),
                           logits,
                           vocab_shard());
    ops::linear_bwd(
        h, weight, logits, ws_.d_norm.slice(0, first, first + rows), vocab_part(table_.grad(head)), Tensor());
}

bool Model::keeps_output(int64_t l) const {
    // Groups of recompute.group_size() blocks from the start of the block's chunk; the chunk's last output is kept.
    const auto c = static_cast<size_t>(chunk_of_block(l));
    const int64_t group = cfg_.recompute.group_size(cfg_.n_layers), lo = chunk_begin_[c], hi = chunk_begin_[c + 1];
    return (l - lo + 1) % group == 0 || l == hi - 1;
}

int Model::chunk_of_block(int64_t l) const {
    int c = 0;
    while (chunk_begin_[static_cast<size_t>(c) + 1] <= l) ++c;
    return c;
}

void Model::group_backward(int64_t first, int64_t last, Tensor*& dout, Tensor*& dx, const GradReadyHook& grad_ready) {
    auto block = [&](int64_t l) -> Block& { return *blocks_[static_cast<size_t>(l)]; };
    auto input = [&](int64_t l) -> const Tensor& { return l == chunk_lo() ? x0_ : block(l - 1).output(); };
    for (int64_t l = first; l <= last; ++l) {  // the group's forward again, from its kept input
        block(l).restore_activations();
        block(l).set_forward_flags(false, true);
        block(l).forward(input(l), ws_);
    }
    for (int64_t l = last; l >= first; --l) {
        block(l).backward(input(l), *dout, *dx, ws_);
        std::swap(dout, dx);
        block(l).release_activations(l < last);  // the group's last output is the next group's input: kept
        if (grad_ready) grad_ready(block_first_param_[static_cast<size_t>(l)]);
    }
}

double Model::last_aux_loss() const {
    // The last forward's chunk (the whole model without pipeline parallelism): other chunks' layers hold other
    // micro-batches' values.
    double sum = 0.0;
    for (int64_t l = chunk_lo(); l < chunk_hi(); ++l)
        if (const MoeLayer* moe = blocks_[static_cast<size_t>(l)]->moe()) sum += moe->aux_loss();
    return sum;
}

std::vector<std::pair<int64_t, Tensor>> Model::kda_final_states() const {
    std::vector<std::pair<int64_t, Tensor>> out;
    for (size_t l = 0; l < blocks_.size(); ++l)
        if (const KdaLayer* kda = blocks_[l]->kda(); kda != nullptr && kda->final_state().defined())
            out.emplace_back(block_layer_[l], kda->final_state());
    return out;
}

void Model::reset_max_logits() {
    for (auto& b : blocks_)
        if (AttentionLayer* a = b->attention()) a->reset_max_logit();
}

std::vector<AttentionLayer*> Model::attention_layers() {
    std::vector<AttentionLayer*> out;
    for (auto& b : blocks_)
        if (AttentionLayer* a = b->attention()) out.push_back(a);
    return out;
}

std::vector<std::pair<int64_t, double>> Model::attention_max_logits() {
    std::vector<std::pair<int64_t, double>> out;
    for (size_t l = 0; l < blocks_.size(); ++l)
        if (AttentionLayer* a = blocks_[l]->attention()) out.emplace_back(block_layer_[l], a->max_logit());
    return out;
}

std::vector<std::pair<int64_t, MoeLayer*>> Model::moe_layers() {
    std::vector<std::pair<int64_t, MoeLayer*>> layers;
    for (size_t l = 0; l < blocks_.size(); ++l)
        if (blocks_[l]->moe() != nullptr) layers.emplace_back(block_layer_[l], blocks_[l]->moe());
    return layers;
}

std::vector<std::pair<int64_t, MoeStepMetrics>> Model::moe_step_end(int64_t step, parallel::Comm* data_group) {
    std::vector<std::pair<int64_t, MoeStepMetrics>> metrics;
    for (auto& [l, moe] : moe_layers()) metrics.emplace_back(l, moe->step_end(step, data_group));
    return metrics;
}

void Model::moe_step_discard() {
    for (auto& [l, moe] : moe_layers()) moe->discard_step();
}

double Model::flops_per_token(int64_t seq) const {
    // Every 2-D weight but the input embedding is one multiply-add per token: the projections, the LM head, and
    // KDA's depthwise conv filters [C, W] (W taps per channel per token).
    double matmul_params = 0.0;
    for (int i = 0; i < table_.size(); ++i) {
        const auto& s = table_.spec(i);  // global shapes: the whole model's FLOPs under any layout
        if (s.shape.size() == 2 && i != embed_)
            matmul_params += static_cast<double>(core::shape_numel(param_global_shape(s)));
    }
    if (cfg_.tie_embeddings) matmul_params += static_cast<double>(cfg_.vocab_size * cfg_.d_model);
    // The routed experts are [E, F, C] stacks: each token passes through top_k of them (gate, up and down).
    matmul_params +=
        static_cast<double>(cfg_.n_moe_layers() * cfg_.moe.top_k * 3 * cfg_.moe.expert_ffn_dim * cfg_.d_model);
    const int64_t n_window = cfg_.n_window_layers();
    // A window layer's global tokens [g, C] are a 2-D parameter but not a per-token matmul (their k and v
    // projections run once per step).
    matmul_params -= static_cast<double>(n_window * cfg_.attn.global_tokens * cfg_.d_model);
    const int64_t n_kda = cfg_.n_kda_layers(), n_attn = cfg_.n_layers - n_kda - n_window;
    // Causal attention: q k^T and p v, each T/2 keys on average, 2 flops per multiply-add, x3 for fwd + bwd.
    const double hd = static_cast<double>(cfg_.n_heads * cfg_.resolved_head_dim());
    const double attn = 6.0 * static_cast<double>(n_attn * seq) * hd;
    // A window layer: the same with each query's min(t + 1, w) keys averaged over the sequence, plus the g global
    // keys: w + g - w (w - 1) / (2 T) when T >= w.
    const double w = static_cast<double>(std::min(cfg_.attn.window, seq)), t = static_cast<double>(seq);
    const double window_keys =
        w * (w + 1.0) / (2.0 * t) + (t - w) * w / t + static_cast<double>(cfg_.attn.global_tokens);
    const double window = 12.0 * static_cast<double>(n_window) * window_keys * hd;
    const double kda = static_cast<double>(n_kda) * kda_flops_per_token(cfg_, seq);
    return 6.0 * matmul_params + attn + window + kda;
}

double kda_flops_per_token(const ModelConfig& cfg, int64_t seq) {
    // Multiply-adds per token and value head of the chunked form (kda.md §4.1), chunk C: the state products
    // W S, (Q e^Gamma) S and the state update (3 K V); the in-chunk triangles A and L (C K / 2 each) and
    // W = T X_w (C K / 2); U = T X_u and A V_new (C V / 2 each). The inverse (C^2 / 6) and elementwise work are
    // left out, as softmax is for attention. x 2 flops x 3 for fwd + bwd.
    const double k = static_cast<double>(cfg.kda_head_dim()), v = static_cast<double>(cfg.kda_head_v_dim());
    const double c = static_cast<double>(std::min(cfg.kda.chunk_size, seq));  // one short chunk when T < C
    const double macs = 3.0 * k * v + c * (1.5 * k + v);
    return 6.0 * static_cast<double>(cfg.kda_num_v_heads()) * macs;
}

}  // namespace mt::nn
