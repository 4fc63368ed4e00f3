// CUDA graphs for a training step's forward and backward (issue 25 item 7; docs/training.md "CUDA graphs").
//
// A step's forward is host work (the batch's checks and upload), the pass's kernels, and host work again (the loss
// sum in f64, the attention layers' maxima); its backward is the d(loss) rows (host scalars) and kernels. The
// kernels are what the graphs record: once, on the first training step, and again whenever graph_key changes. A
// replay does not run the host code that queued them, so everything that code chose (buffers, shapes, scalars) has
// to be the same on every step the graph replays: graph_blocker names the features where it is not (their host work
// sits between kernels, or their buffers change from batch to batch), and graph_key holds the rest.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/exec.h"
#include "core/trace.h"
#include "nn/model.h"
#include "ops/cross_entropy.h"
#include "ops/embedding.h"

namespace mt::nn {

namespace {

// Records work into graph with the ops' device-side index checks (a synchronisation) skipped: the model checked the
// batch on the host first (check_batch_indices).
void capture_checked(core::CapturedGraph& graph, core::Device device, const std::function<void()>& work) {
    core::ExecCtx ctx = core::exec();
    ctx.indices_checked = true;
    const core::ExecScope scope(ctx);
    graph.capture(device, work);
}

}  // namespace

void Model::set_cuda_graphs(bool on) {
    graphs_.enabled = on;
    // A captured backward replays for every micro-batch: it must add its weight gradients, not write the first.
    table_.set_first_grad_writes(!on);
    if (!on) drop_graphs();
}

std::string Model::graph_blocker() const {
    if (!core::graphs_supported(precision_.device)) return "the device has no CUDA graphs (a CPU run)";
    if (core::profile_enabled()) return "the range profile (it synchronises around every range)";
    if (core::profile_requested("kda") || core::profile_requested("kda_phases"))
        return "MT_PROFILE's KDA timings (they synchronise inside the KDA calls)";
    if (cfg_.n_moe_layers() > 0) return "MoE layers (the routing's counts and expert offsets are read on the host)";
    if (tp_.active()) return "tensor parallelism";
    if (cp_.active()) return "context parallelism";
    if (num_chunks() != 1 || !chunk_has_embedding(0) || !chunk_has_head(0)) return "pipeline parallelism";
    if (params_needed_) return "ZeRO's parameter gathers";
    if (cfg_.segments.enabled()) return "sequence segments";
    if (cfg_.document_mask && cfg_.n_kda_layers() > 0)
        return "document masking with KDA layers (they plan each batch's packed documents on the host)";
    if (vision_) return "the vision encoder";
    return "";
}

// The batch's shape and the RoPE base are not in it: Model::forward drops the graphs and warms up again when they
// change (graphs_.shape).
std::vector<double> Model::graph_key() const {
    auto address = [](const Tensor& t) {  // of a buffer the kernels read or add to; 0 when undefined
        return static_cast<double>(reinterpret_cast<uintptr_t>(t.defined() ? t.raw() : nullptr));
    };
    return {attnres_ ? attnres_->blend() : 0.0,
            address(layer_stats_),  // the metrics' stat buffer (undefined on the steps without metrics)
            track_predictions_ ? 1.0 : 0.0,
            // The document maps the kernels read (document masking), in place from batch to batch.
            address(docs_.doc_start),
            address(docs_.positions)};
}

void Model::check_batch_indices() const {
    ops::check_embedding_ids(seq_ids_, table_.param(embed_).size(0), "embedding_fwd");
    ops::check_cross_entropy_targets(seq_targets_, vocab_rows(), kIgnoreIndex, "cross_entropy_fwd");
}

double Model::graph_forward(const Tensor& ids, const Tensor& targets) {
    chunk_ = 0;
    prepare_batch(ids, targets, /*training=*/true, /*reset_metrics=*/true);
    check_batch_indices();
    begin_pass(ids.size(0), 0, /*recompute=*/false, /*count=*/true);
    const std::vector<double> key = graph_key();
    if (!graphs_.forward.ready() || key != graphs_.key) {
        drop_graphs(/*cold=*/false);
        capture_checked(graphs_.forward, precision_.device, [&] { pass_forward_kernels(); });
        graphs_.key = key;
        graphs_.max_logit_layers.clear();  // the attention layers whose row maxima the recorded kernels write
        for (auto& b : blocks_)
            if (AttentionLayer* a = b->attention(); a != nullptr && a->max_logit_written())
                graphs_.max_logit_layers.push_back(a);
        ++graphs_.captures;
    } else {
        ++graphs_.replays;
    }
    graphs_.forward.launch();
    graphs_.forward_ran = true;
    for (AttentionLayer* a : graphs_.max_logit_layers) a->mark_max_logit_written();
    collect_max_logits(/*keep_buffers=*/true);
    const double sum = pass_loss();
    return counted_ > 0 ? sum / static_cast<double>(counted_) : 0.0;
}

void Model::graph_backward(double loss_scale) {
    // A replay runs no host code, so a hook that must hear of each layer's gradients (data parallelism) cannot be
    // served: the trainer turns graphs on only for a single process.
    MT_CHECK(!grad_ready_, "a captured step's backward cannot call the gradient-ready hook (data parallelism)");
    fill_dlosses(loss_scale);
    if (!graphs_.backward.ready())
        capture_checked(graphs_.backward, precision_.device, [&] {
            pass_backward_kernels(loss_scale, /*last_pass=*/true, Tensor());
        });
    graphs_.backward.launch();
}

void Model::drop_graphs(bool cold) {
    graphs_.forward.reset();
    graphs_.backward.reset();
    graphs_.key.clear();
    graphs_.max_logit_layers.clear();
    graphs_.forward_ran = false;
    // After another kind of forward (an evaluation, another shape) the next training forward runs eagerly first:
    // what it creates the first time (a RoPE table, a kernel's module) then exists before a capture records it.
    if (cold) graphs_.warm = graphs_.warming = false;
}

void Model::collect_max_logits(bool keep_buffers) {
    for (int64_t l = chunk_lo(); l < chunk_hi(); ++l)  // the pass's chunk: another chunk's maxima are not this pass's
        if (AttentionLayer* a = blocks_[static_cast<size_t>(l)]->attention()) a->collect_max_logit(keep_buffers);
}

}  // namespace mt::nn
