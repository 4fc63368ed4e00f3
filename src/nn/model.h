// nn::Model, the decoder-only LM: token embedding, N pre-norm blocks (a token mixer + an FFN: SwiGLU MLP or MoE),
// final RMSNorm, LM head (tied to the embedding or its own weight). With model attnres.mode = block|full the residual
// adds are replaced by Block Attention Residuals (nn/layers/attnres.h). The mixer of layer l is GQA softmax attention
// or KDA, as ModelConfig::layer_pattern says (all attention by default: the dense model). Forward and backward read top
// to bottom, per layer.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/graph.h"
#include "nn/block.h"
#include "nn/context_parallel.h"
#include "nn/documents.h"
#include "nn/layers/attnres.h"
#include "nn/tensor_parallel.h"
#include "nn/vision/vision_encoder.h"
#include "ops/op_common.h"

namespace mt::nn {

constexpr int32_t kIgnoreIndex = -1;

// Training FLOPs per token of one KDA layer's recurrence (the chunked form, fwd + bwd; its projections count as
// matmul parameters): 6 * HV * (3 K V + C (1.5 K + V)), C = min(kda.chunk_size, T).
double kda_flops_per_token(const ModelConfig& cfg, int64_t seq);

class Model {
   public:
    // param_align: every parameter's arena offset is a multiple of it (ParamTable::finalize). ep: expert parallelism,
    // this rank's share of every MoE layer's experts (the default: all of them). tp: tensor parallelism, this rank's
    // shard of every layer (nn/tensor_parallel.h), with a vocab-parallel embedding and LM head (this rank's rows of
    // the vocabulary, the last shard padded; the loss combines the shards' row statistics, the logits are never
    // gathered). cp: context parallelism, this rank's zigzag share of every sequence (nn/context_parallel.h): the
    // batch is the whole [B, T] on every cp rank, the layers run on the rank's [B, T / cp] tokens, the loss is the
    // mean over the whole sequence (summed over the cp group), and each rank's gradients are its tokens' part of the
    // sum over cp (the trainer reduces them over the data-parallel span, cp included).
    Model(const ModelConfig& cfg,
          const Precision& precision,
          int64_t param_align = 64,
          const MoeExpertParallel& ep = {},
          const TensorParallel& tp = {},
          const ModelPart& part = {},
          const ContextParallel& cp = {})
        : Model(cfg, precision, param_align, ep, tp, part, true, cp) {}
    // The parameter table this constructor would build, laid out (ParamTable::layout) but not allocated: the same
    // declarations in the same order, so its offsets and arena sizes are the real ones. No arena, activation or
    // workspace is allocated (ep needs no communicators). The memory planner's source of parameter bytes.
    static ParamTable param_layout(const ModelConfig& cfg,
                                   const Precision& precision,
                                   int64_t param_align = 64,
                                   const MoeExpertParallel& ep = {},
                                   const TensorParallel& tp = {},
                                   const ModelPart& part = {});

    ParamTable& params() {
        return table_;
    }
    const TensorParallel& tensor_parallel() const {
        return tp_;
    }
    const ParamTable& params() const {
        return table_;
    }
    const ModelConfig& config() const {
        return cfg_;
    }
    // The RoPE base of the global attention layers from the next forward on (model.rope_theta at construction): the
    // context-length curriculum's per-stage base. Window layers keep attn.window_rope_base.
    void set_rope_theta(double theta) {
        cfg_.rope_theta = theta;
        for (auto& b : blocks_) b->set_rope_theta(theta);
    }
    // How the next batches' rows are cut into sequence segments (ModelConfig::segments at construction): the
    // trainer's per-length choice under long.tokens_per_gpu. The offload setting stays the construction's.
    void set_segments(const SegmentConfig& segments) {
        const bool offload = cfg_.segments.offload_kv;
        cfg_.segments = segments;
        cfg_.segments.offload_kv = offload;
    }

    // ids, targets: [B, T] i32 on the host; targets equal to kIgnoreIndex do not count. Returns the mean loss over
    // the counted targets (0 when none), and keeps what backward needs. training = false (evaluation) keeps the MoE
    // layers from counting the routing for balancing and metrics. With ModelConfig::segments the sequence runs as
    // consecutive segments (long_context.md §4), each with the caches of the ones before it, and the backward
    // runs them last first, re-running each one's forward but the last's: the same loss and gradients as one
    // pass, with one segment's activations held at a time. Refused then (exit 1): MoE with a capacity factor or the
    // auxiliary loss (both per batch), a segment before the last shorter than the short conv's halo.
    double forward(const Tensor& ids, const Tensor& targets, bool training = true);
    // Accumulates (+=) into the parameter gradients the gradient of loss_scale * (mean loss of the last forward).
    void backward(double loss_scale);

    // CUDA graphs (train.cuda_graphs; model_graph.cpp, docs/training.md "CUDA graphs"). On, and where
    // graph_blocker() is empty, a training forward's kernels and those of its backward are recorded as two graphs
    // once and replayed on later calls, the host work around them (the batch's upload and checks, the loss sum,
    // the attention maxima, the backward's d(loss) rows) still done each time; they are recorded again when what
    // they bake in changes (the batch's shape, the AttnRes blend, the metrics' stat buffer). Any other forward (an
    // evaluation) drops them first: it may move the buffers they use. The same numbers as without, bit for bit.
    void set_cuda_graphs(bool on);
    // Why training steps run without graphs here ("" when they are captured): the device, or a feature whose host
    // work sits between the kernels (MoE routing, parallel layouts, segments, document masks, the vision tower).
    std::string graph_blocker() const;
    int64_t graph_captures() const {
        return graphs_.captures;
    }
    int64_t graph_replays() const {
        return graphs_.replays;
    }

    // Image + text batches (ModelConfig::vision enabled; src/nn/model_vision.cpp): the images of the next forward,
    // packed (multimodal.md §1). The batch's ids hold vision.image_token at exactly batch.num_tokens() places, whose
    // embeddings the projector's outputs replace in order, image after image in raster order (§3); their gradients
    // flow into the projector and the ViT. Kept until replaced; an empty batch (the default) is a text-only one.
    // Under pipeline parallelism only the part holding the embedding has the tower (vision() is null elsewhere): its
    // chunk of layer 0 encodes the images in every forward_chunk, re-runs included, and passes the gradient at the
    // image slots into the projector and the ViT in its backward_chunk, so set the micro-batch's images before each
    // forward_chunk of that chunk. Refused with sequence segments, context or tensor parallelism (not built yet).
    void set_vision_batch(VisionBatch batch);
    VisionEncoder* vision() {
        return vision_.get();
    }

    // Pipeline parallelism (src/nn/model_pipeline.cpp). The forward of this rank's chunk `chunk` on the micro-batch
    // (ids, targets) [B, T] on the host: the embedding when the chunk starts the model, else `input` [stream rows,
    // C] (the previous chunk's output); the final norm, LM head and loss when it ends the model, whose mean loss it
    // returns (else 0). recompute: the re-run, before its backward, of a forward that another micro-batch's forward
    // has followed since (the routing is not counted again). With sequence segments the chunk runs them in turn
    // (its input and output the whole sequence's). Under Block AttnRes the
    // chunk's input is the micro-batch's carry instead (set_attnres_carry; `input` undefined), which the forward
    // leaves the chunk's outputs in and the backward the gradients of its upstream sources (attnres.md §7).
    double forward_chunk(
        int chunk, const Tensor& ids, const Tensor& targets, const Tensor& input, bool training, bool recompute);
    // The backward of the last forward_chunk: d_output [stream rows, C] is the gradient of chunk_output() (undefined
    // under Block AttnRes: the carry holds the gradients); a chunk that ends the model takes loss_scale instead (as
    // backward()). Accumulates the parameter gradients.
    void backward_chunk(double loss_scale, const Tensor& d_output);
    // The last forward_chunk's output (its last block's, valid until that chunk's next forward) and the last
    // backward_chunk's gradient of its input (valid until the next backward).
    const Tensor& chunk_output() const;
    const Tensor& chunk_input_grad() const {
        return input_grad_;
    }
    // Block AttnRes under pipeline parallelism: the carry of the micro-batch the next forward_chunk or
    // backward_chunk runs (null: none, the whole model in one chunk).
    void set_attnres_carry(AttnResCarry* carry) {
        attnres_carry_ = carry;
    }
    int num_chunks() const {
        return static_cast<int>(part_.chunks.size());
    }
    bool chunk_has_embedding(int chunk) const {
        return part_.chunks.at(static_cast<size_t>(chunk)).first == 0;
    }
    bool chunk_has_head(int chunk) const {
        return part_.chunks.at(static_cast<size_t>(chunk)).second == cfg_.n_layers;
    }
    // The parameter holding the embedding (-1 when this part has none): under pipeline parallelism with tied
    // embeddings the first and the last stage each hold a copy, whose gradients the trainer sums.
    int embedding_param() const {
        return embed_;
    }
    // Called during backward each time the gradients of every parameter with table index >= first are complete
    // for this backward (after the head, after each block, and once with 0 at the end): data parallelism starts
    // reducing those buckets while the rest of the backward runs. Empty (the default): no calls.
    using GradReadyHook = std::function<void(int first)>;
    void set_grad_ready_hook(GradReadyHook hook) {
        grad_ready_ = std::move(hook);
    }
    // Called during forward before the model reads parameters it has not read yet: every parameter with table
    // index < end is about to be used (before the embedding, before each block, before the head). ZeRO-1 waits
    // there for the parameter gathers of the last step, so they overlap the forward. Empty: no calls.
    using ParamsNeededHook = std::function<void(int end)>;
    void set_params_needed_hook(ParamsNeededHook hook) {
        params_needed_ = std::move(hook);
    }
    // The optimizer step the next forward/backward belong to (schedules inside the model: the AttnRes residual
    // blend). The trainer sets it before each step; 0 until then.
    void set_train_step(int64_t step) {
        if (attnres_) attnres_->set_step(step);
    }
    // metrics.layer_stats: the step's stat buffer ([layer_stats_layout(cfg).size] f64 on the model's device,
    // nn/layer_stats.h) that the next training forwards add to (each pass's first run, never a recompute's re-run
    // nor an evaluation), until set again; undefined (the other steps): nothing is collected and nothing costs.
    void set_layer_stats(const Tensor& slots) {
        layer_stats_ = slots;
    }
    // This part's block i (in the part's order), for inspection: its output and saved tensors (the layer-stats tests).
    Block& block_at(int64_t i) {
        return *blocks_[static_cast<size_t>(i)];
    }
    int64_t last_counted_tokens() const {
        return counted_;
    }
    // Per-row loss multipliers for the next forwards and backwards (the loss weighting of multimodal.md §5,
    // train/loss_weighting.h): the tokens of row b weigh weights[b] in forward's returned loss (the weighted sum over
    // the counted tokens / their count) and in their gradient (the cross-entropy's per-row dlosses). Empty: every row
    // 1, the plain mean, computed as before (bitwise). weights: [B] of the next batch.
    void set_row_loss_weights(std::vector<double> weights) {
        row_loss_weights_ = std::move(weights);
    }
    // Sum over the MoE layers of the last forward's auxiliary balancing loss (moe.balance = "aux_loss"; else 0); under
    // pipeline parallelism over the last forward_chunk's layers. It is not part of forward()'s return value; backward
    // adds its gradient with the same loss_scale.
    double last_aux_loss() const;
    // Per KDA layer (block index), the final state S_T [B, HV, K, V] of the last forward (each row's last document
    // under document masking), in the statistics dtype; empty before the first forward. (The state is not among what
    // recompute drops: a forward re-run in the backward writes the same values.)
    std::vector<std::pair<int64_t, Tensor>> kda_final_states() const;
    // The last forward's per-token cross-entropy [B * T] in the statistics dtype on the model's device (0 where the
    // target is ignored); valid until backward, which overwrites it.
    const Tensor& last_token_losses() const {
        return seq_losses_.defined() ? seq_losses_ : losses_;
    }
    // Greedy predictions (the shapes controls' exact match, docs/multimodal.md): with tracking on, every forward also
    // writes the LM head's argmax per position [B * T] i32 on the model's device (ops::argmax_rows: the first maximum),
    // valid until the next forward. One pass without tensor or context parallelism only (the vocabulary or the
    // sequence would be split across ranks); MT_CHECK otherwise. Off by default: it costs one read of the logits.
    void set_track_predictions(bool on) {
        track_predictions_ = on;
    }
    const Tensor& last_predictions() const {
        return predictions_;
    }
    // The segment boundaries [0, b_1, ..., T] of the last forward ({0, T}: one pass).
    const std::vector<int64_t>& segment_bounds() const {
        return bounds_;
    }
    // Long-context metrics: with tracking on, each attention layer (block index) records the largest pre-softmax
    // logit of the last forward (all its segments), reset by every forward; -inf before one or with tracking off.
    void set_track_max_logit(bool on) {
        for (auto& b : blocks_)
            if (AttentionLayer* a = b->attention()) a->set_track_max_logit(on);
    }
    std::vector<std::pair<int64_t, double>> attention_max_logits();
    // This rank's attention layers (block order), for the per-head maxima QK-clip reads.
    std::vector<AttentionLayer*> attention_layers();
    // Step mode (the trainer's, for QK-clip): the max logits run over every forward until reset_max_logits, instead
    // of each forward starting them over.
    void set_max_logit_per_step(bool on) {
        max_logit_per_step_ = on;
    }
    void reset_max_logits();
    // The MoE layers (block index, layer), in order; empty for a dense model.
    std::vector<std::pair<int64_t, MoeLayer*>> moe_layers();
    // End of a training step for every MoE layer (MoeLayer::step_end: balancer update, metrics, collapse alarm).
    // data_group: the ranks whose routing counts are summed first (see MoeLayer::step_end).
    std::vector<std::pair<int64_t, MoeStepMetrics>> moe_step_end(int64_t step, parallel::Comm* data_group = nullptr);
    // Drops the routing counts of a training step that is not applied (trainer_health.cpp), on every MoE layer.
    void moe_step_discard();
    // Model-level activations kept for backward (blocks declare their own).
    std::vector<SavedTensor> saved_for_backward();
    // Bytes of every activation held for the backward now, the model's and every block's (a recompute policy holds
    // fewer after the forward), and the vision tower's saved buffers as allocated (VisionEncoder: the size of the
    // largest image batch so far).
    size_t saved_activation_bytes();
    // Bytes of the shared backward workspace now: d_norm, d_tmp and every slot (sized at their largest use by the
    // first backward). The memory planner's workspace line is checked against it.
    size_t workspace_bytes() const;
    // Training FLOPs per token (fwd + bwd): 6 * (2-D weights but the input embedding, the active routed experts
    // top_k * 3 * F * C per MoE layer included; a window layer's global tokens not) + 6 * n_attn_layers * T * (Hq * D)
    // for causal attention + 12 * n_window_layers * (mean over t of min(t + 1, w) + g) * (Hq * D) for window layers
    // + n_kda_layers * kda_flops_per_token(cfg, T).
    double flops_per_token(int64_t seq) const;

   private:
    // allocate = false: declare the parameters and lay the table out only (param_layout).
    Model(const ModelConfig& cfg,
          const Precision& precision,
          int64_t param_align,
          const MoeExpertParallel& ep,
          const TensorParallel& tp,
          const ModelPart& part,
          bool allocate,
          const ContextParallel& cp = {});
    void resize(int64_t batch, int64_t seq);
    // Recompute full over the plain residual stream: blocks run in groups of recompute.group_size(); only each
    // group's input (the output of the block before it) and the last block's output survive the forward.
    bool full_recompute() const {
        return cfg_.recompute.full() && !attnres_;
    }
    bool keeps_output(int64_t l) const;
    // The LM head and the loss rows [first, first + rows) into logits_ (forward), or the backward of those rows:
    // dlogits in logits_, dh into ws_.d_norm's rows, the head's gradient accumulated.
    void head_chunk_forward(int64_t first, int64_t rows);
    // The per-row d(loss) of the backward into losses_ (loss_scale / counted_, or the rows' weights), then the head's
    // backward: the loss rows' gradient through the LM head and the final norm into dres_a_.
    void fill_dlosses(double loss_scale);
    void head_backward();
    void head_chunk_backward(int64_t first, int64_t rows, bool recompute_logits);
    // With row loss weights (model_loss_weights.cpp): the pass's weighted loss sum over the counted tokens of the host
    // losses [batch_ * seq_], and the per-token d(loss) of the backward, scale / counted_ x the row's weight, into
    // losses_.
    double weighted_loss_sum(const Tensor& losses) const;
    void fill_weighted_dlosses(double scale);
    // Vocab-parallel loss: each rank's head chunks left its shard's log-sum-exp in lse_ and the target logits it
    // holds in losses_; this combines them over tp into every row's log-sum-exp and loss (on the host, in f64).
    void combine_vocab_shards();
    // The vocabulary shard this rank's embedding and head rows cover, the real rows of it (a padded last shard's
    // extra rows are zeros that no op sees), and those rows of an embedding or head tensor.
    ops::VocabShard vocab_shard() const;
    int64_t vocab_rows() const;
    Tensor vocab_part(const Tensor& t) const;
    // Backward of blocks [first, l], l the last of its group: re-runs the group's forward, then its backward.
    void group_backward(int64_t first, int64_t last, Tensor*& dout, Tensor*& dx, const GradReadyHook& grad_ready);
    // The active chunk's blocks [lo, hi) (local indices), and the chunk a local block belongs to.
    int64_t chunk_lo() const {
        return chunk_begin_[static_cast<size_t>(chunk_)];
    }
    int64_t chunk_hi() const {
        return chunk_begin_[static_cast<size_t>(chunk_) + 1];
    }
    int chunk_of_block(int64_t l) const;
    // The active chunk's pass of the AttnRes stack: its sub-layers, with the carry under pipeline parallelism.
    AttnResPass attnres_pass() const {
        const auto& [first, last] = part_.chunks[static_cast<size_t>(chunk_)];
        return {.first = 2 * first,
                .last = 2 * last,
                .embedding = first == 0,
                .head = last == cfg_.n_layers,
                .carry = attnres_carry_};
    }
    // The batch's host copies, documents, loss count and one pass of the whole sequence, or its segments (forward
    // and forward_chunk).
    void prepare_batch(const Tensor& ids, const Tensor& targets, bool training, bool reset_metrics);
    // The boundaries of a sequence of seq tokens under cfg_.segments (checks what segments refuse).
    std::vector<int64_t> plan_segments(int64_t seq) const;
    // Sizes the model for segment j of the batch in seq_ids_ / seq_targets_, fills its inputs and tells the blocks
    // (recompute: the backward's re-run of its forward).
    // count = false: the routing is not counted (a pipeline stage's re-run of a forward it ran before).
    void begin_pass(int64_t batch, int64_t j, bool recompute, bool count = true);
    // Pipeline chunks over sequence segments (model_pipeline.cpp): segment j's rows of the chunk's input into x0_,
    // and the active pass's output (the last block's, or x0_ for a chunk of no blocks).
    void segment_input(int64_t j);
    const Tensor& last_output() const;
    // One pass (the whole sequence or a segment): embedding, blocks, head and loss; returns the summed loss of its
    // counted rows. pass_backward: its backward; last_pass: the last of the step (the gradients are complete).
    double pass_forward();
    // d_output: the gradient of the chunk's output, for a chunk that does not end the model.
    void pass_backward(double loss_scale, bool last_pass, const Tensor& d_output = Tensor());
    // Their device halves, which a CUDA graph records (model_graph.cpp): pass_forward_kernels queues the pass's
    // kernels, the per-token losses left in losses_ (returns whether the chunk has the head); pass_loss sums them on
    // the host; collect_max_logits folds the attention layers' row maxima of the pass into their maxima (host).
    // pass_backward_kernels is pass_backward after fill_dlosses.
    bool pass_forward_kernels();
    double pass_loss();
    void collect_max_logits(bool keep_buffers = false);
    void pass_backward_kernels(double loss_scale, bool last_pass, const Tensor& d_output);
    // The graph path of forward and backward (model_graph.cpp).
    struct StepGraphs {
        bool enabled = false;
        core::CapturedGraph forward, backward;
        std::vector<double> key;                        // what else the recorded kernels bake in (graph_key)
        bool forward_ran = false;                       // the last forward replayed: the backward replays too
        bool warming = false, warm = false;             // an eager training step has run (and finished) with graphs on
        std::vector<int64_t> shape;                     // the batch shape and RoPE base that warm step ran
        std::vector<AttentionLayer*> max_logit_layers;  // those whose row maxima the forward's graph writes
        int64_t captures = 0, replays = 0;
        Tensor doc_start, positions;  // the batches' document maps, in place (document masking)
    };
    // host copied into buffer on device (allocated there where it is undefined or of another shape); returns buffer.
    static Tensor in_place(Tensor& buffer, const Tensor& host, core::Device device);
    double graph_forward(const Tensor& ids, const Tensor& targets);
    void graph_backward(double loss_scale);
    // cold: the next training forward runs eagerly before the graphs are recorded again.
    void drop_graphs(bool cold = true);
    std::vector<double> graph_key() const;
    // The batch's ids and targets checked on the host (the captured ops skip their own device checks).
    void check_batch_indices() const;
    // The vision encoder's part of a batch (model_vision.cpp): prepare_batch finds the image slots of the ids and
    // checks them against the images; the forward, after the embedding, writes the projector's outputs into x0_'s
    // slots; the backward takes those rows of the embedding's gradient (zeroing them: the placeholder's embedding
    // was replaced) through the projector and the ViT.
    void vision_prepare();
    void vision_forward();
    void vision_backward(const Tensor& d_embed);
    // The pass's token modalities (0 text, 1 image slot: the id vision.image_token) for the active chunk's MoE layers
    // (multimodal.md §3-§4), from the pass's ids [N] on the host; only when they take them (MoeLayer::per_modality).
    void moe_modality_prepare(const Tensor& host_ids);

    ModelConfig cfg_;
    Precision precision_;
    TensorParallel tp_;
    ContextParallel cp_;
    ModelPart part_;
    std::vector<int64_t> chunk_begin_;  // local index of each chunk's first block, and the block count at the end
    std::vector<int64_t> block_layer_;  // the global layer index of each local block
    int chunk_ = 0;                     // the chunk the next pass runs
    std::vector<Tensor> chunk_in_;      // [stream rows, C] each chunk's input (x0_ views the active one's)
    Tensor input_grad_;                 // the last backward's gradient of its chunk's input
    // A pipeline chunk over sequence segments: the whole sequence's input, output and input gradient [B T, C].
    Tensor seq_input_, seq_output_, seq_input_grad_;
    ParamTable table_;
    int embed_ = -1, final_norm_ = -1, lm_head_ = -1;
    int input_params_end_ = 0;  // the parameters the embedding's forward reads: the embedding's and the vision tower's
    std::vector<std::unique_ptr<Block>> blocks_;
    std::vector<int> block_first_param_;  // table index of each block's first parameter
    GradReadyHook grad_ready_;
    ParamsNeededHook params_needed_;
    std::unique_ptr<AttnResStack> attnres_;  // Block Attention Residuals in place of the residual adds, or null
    std::vector<Block*> layer_block_;        // AttnRes: the blocks by global layer (null where not held)
    AttnResCarry* attnres_carry_ = nullptr;  // AttnRes under pipeline parallelism: the micro-batch's carry
    Workspace ws_;
    // The rows' loss weights (set_row_loss_weights): [B], or empty for the plain mean.
    std::vector<double> row_loss_weights_;
    int64_t batch_ = 0, seq_ = 0, counted_ = 0;
    Tensor ids_, targets_;       // [N] i32, copies of the batch on the model's device
    Tensor host_targets_;        // [N] i32, for counting
    Documents docs_;             // the batch's documents (document masking), or undefined
    Tensor x0_;                  // [N, C] embedding output
    Tensor final_, final_rstd_;  // [N, C], [N] (rstd in the statistics dtype); N: the stream rows
    Tensor final_full_;          // sequence parallelism: [B T, C], the all-gather of final_ (the head's input)
    Tensor logits_;              // [head rows, V]; overwritten in place by dlogits in backward
    Tensor losses_, lse_;        // [N] in the statistics dtype
    Tensor predictions_;         // [N] i32, the head's argmax (set_track_predictions)
    bool track_predictions_ = false;
    Tensor dres_a_, dres_b_;  // [N, C] residual-stream gradients, ping-pong
    // The whole batch: its segment boundaries, the pass now in the buffers above, host copies of ids and targets
    // [B, T], its documents (host maps) and, with segments, its per-token losses [B * T] on the host.
    std::vector<int64_t> bounds_;
    int64_t pass_ = 0, total_seq_ = 0;
    bool training_ = true;
    bool max_logit_per_step_ = false;  // set_max_logit_per_step
    Tensor layer_stats_;               // set_layer_stats
    Tensor pass_stats_;                // the active pass's: layer_stats_ on a first training forward, else undefined
    Tensor seq_ids_, seq_targets_, seq_losses_;
    Documents seq_docs_;
    std::unique_ptr<VisionEncoder> vision_;  // the ViT and projector (first stage), or null
    VisionBatch vision_batch_;
    Tensor vision_slots_;        // [M] i32 on the model's device: the rows of [B T] that hold the image embeddings
    bool moe_modality_ = false;  // the MoE layers take the tokens' modalities (moe_modality_prepare)
    StepGraphs graphs_;
};

}  // namespace mt::nn
