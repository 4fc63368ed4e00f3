// Pipeline parallelism (docs/distributed.md "Pipeline parallelism", parallel.md §3): the stage split, the step's
// schedule of chunk forwards and backwards with the activations and their gradients passed by send/recv between the
// neighbouring stages, evaluation through the stages, and the tied embedding's two copies.
//
// Each rank holds its chunks' blocks with one set of activation buffers per block. A chunk's backward needs the
// activations of its own micro-batch's forward; when another forward ran on this rank since (1F1B's warm-up, every
// stage but the last), the chunk's forward is re-run first from its kept input (the input of every micro-batch in
// flight is kept). So a stage holds one micro-batch's activations plus the inputs in flight, and pays up to one more
// forward per micro-batch: full recompute at stage granularity (Megatron's --recompute-granularity full).
//
// Under Block AttnRes a chunk reads more than its predecessor's output: the embedding and the block sums completed
// upstream (attnres.md §7). Each rank keeps a carry per micro-batch in flight (nn::AttnResCarry) holding every
// source it received or produced, and a hop sends only those the receiver lacks (attnres.pp_cache); the backward
// sends the gradients of the same sources back once each.
//
// Image batches: the vision tower lives with the embedding, on the rank holding chunk 0 (the first stage). Every stage
// reads the step's micro-batches (the same rows, with their images); the first stage hands micro-batch m's images to
// the model before each forward of chunk 0 on m, its re-run included, so the splice and the backward into the
// projector and the ViT always see m's images. Nothing about the images crosses a stage boundary: the later stages see
// image embeddings as rows of the activation.
#include <array>
#include <chrono>
#include <map>

#include "core/clock.h"
#include "ops/add.h"
#include "parallel/pipeline_schedule.h"
#include "train/trainer.h"

namespace mt::train {

// This rank's links in the pipeline: the communicator of its pp group (NCCL's on GPUs), the neighbouring stages, and
// a new buffer for an activation of `token_rows` rows arriving from one (the rows this rank holds of them: 1 / tp
// under sequence parallelism, and its zigzag 1 / cp under context parallelism, whose ranks of a stage talk to the same
// cp rank of the next).
struct PipeLinks {
    parallel::Comm* comm;
    int next, prev;
    core::DType dtype;
    core::Device device;
    int64_t rows_divisor, d_model;
    core::Tensor activation(int64_t token_rows, core::DType type) const {
        return core::Tensor::zeros({token_rows / rows_divisor, d_model}, type, device);
    }
    core::Tensor activation(int64_t token_rows) const {
        return activation(token_rows, dtype);
    }
};

// Block AttnRes over the pipeline: the sources each hop into a chunk carries (model-order chunk index).
struct AttnResHops {
    std::vector<std::pair<int64_t, int64_t>> sub_layers;  // every chunk's sub-layers, model order
    int64_t stages = 1, block = 1;
    bool cache = true;
    std::vector<int64_t> into(int64_t chunk) const {
        return nn::attnres_hop_sources(sub_layers, chunk, stages, cache, block);
    }
};

namespace {

// Per-layer training FLOPs per token (the balanced split's cost): 6 x the layer's 2-D weights (the routed experts'
// active part only) plus its token mixer's sequence term, as Model::flops_per_token counts them.
std::vector<double> layer_costs(const nn::ModelConfig& m, int64_t seq) {
    const nn::ParamTable table = nn::Model::param_layout(m, nn::Precision{});
    std::vector<double> cost(static_cast<size_t>(m.n_layers), 0.0);
    for (int i = 0; i < table.size(); ++i) {
        const nn::ParamSpec& spec = table.spec(i);
        if (spec.name.rfind("layers.", 0) != 0 || spec.shape.size() != 2) continue;
        const auto l = static_cast<size_t>(std::stoll(spec.name.substr(7)));
        cost[l] += 6.0 * static_cast<double>(core::shape_numel(spec.shape));
    }
    const double hd = static_cast<double>(m.n_heads * m.resolved_head_dim());
    for (int64_t l = 0; l < m.n_layers; ++l) {
        double& c = cost[static_cast<size_t>(l)];
        if (m.layer_is_moe(l)) c += 6.0 * static_cast<double>(m.moe.top_k * 3 * m.moe.expert_ffn_dim * m.d_model);
        if (m.layer_is_kda(l))
            c += nn::kda_flops_per_token(m, seq);
        else
            c += 6.0 * static_cast<double>(m.layer_is_window(l) ? std::min(m.attn.window, seq) : seq) * hd;
    }
    return cost;
}

// The message tag of an activation (dir 0) or gradient (dir 1) arriving at model-order chunk `chunk` for
// micro-batch `micro` (MPI guarantees tags up to 32767).
int pipe_tag(int64_t chunk, int64_t micro, int64_t micros, int dir) {
    return static_cast<int>(((chunk * micros + micro) * 2 + dir) % 32000);
}

}  // namespace

PipeLinks Trainer::pipe_links() const {
    const int64_t stages = mesh_->size(parallel::MeshAxis::pp), stage = mesh_->coord(parallel::MeshAxis::pp);
    const int64_t tp = mesh_->size(parallel::MeshAxis::tp), cp = mesh_->size(parallel::MeshAxis::cp);
    return {.comm = nccl_pp_ ? nccl_pp_.get() : &mesh_->group(parallel::MeshGroup::pp),
            .next = static_cast<int>((stage + 1) % stages),
            .prev = static_cast<int>((stage + stages - 1) % stages),
            .dtype = model_->params().precision().compute,
            .device = model_->params().grad_arena().device(),
            .rows_divisor = (cfg_.parallel.sequence_parallel ? tp : 1) * cp,
            .d_model = cfg_.model.d_model};
}

std::vector<std::pair<int64_t, int64_t>> Trainer::pipeline_chunks() const {
    const auto& p = cfg_.parallel;
    const int64_t chunks = mesh_->size(parallel::MeshAxis::pp) * p.pp_virtual_stages;
    std::vector<int64_t> sizes = p.pp_layers_per_stage;
    if (sizes.empty()) {
        // The head's cost: the LM head matmul (6 V C per token); the embedding lookup costs next to nothing.
        const double head = 6.0 * static_cast<double>(cfg_.model.vocab_size * cfg_.model.d_model);
        sizes = parallel::pipeline_split(layer_costs(cfg_.model, seq_len_), 0.0, head, chunks);
    }
    std::vector<std::pair<int64_t, int64_t>> out;
    int64_t first = 0;
    for (int64_t size : sizes) out.emplace_back(first, first + size), first += size;
    return out;
}

nn::ModelPart Trainer::pipeline_part() const {
    const int64_t stages = mesh_->size(parallel::MeshAxis::pp), stage = mesh_->coord(parallel::MeshAxis::pp);
    if (stages * cfg_.parallel.pp_virtual_stages == 1) return {};
    const auto chunks = pipeline_chunks();
    nn::ModelPart part;
    for (size_t k = 0; k < chunks.size(); ++k)
        if (static_cast<int64_t>(k) % stages == stage) part.chunks.push_back(chunks[k]);
    return part;
}

AttnResHops Trainer::attnres_hops() const {
    AttnResHops hops{.sub_layers = {},
                     .stages = mesh_->size(parallel::MeshAxis::pp),
                     .block = cfg_.model.attnres.resolved_block_size(),
                     .cache = cfg_.model.attnres.pp_cache};
    for (const auto& [first, last] : pipeline_chunks()) hops.sub_layers.emplace_back(2 * first, 2 * last);
    return hops;
}

double Trainer::pipeline_micro_batches(const std::vector<double>& weights, double grad_scale, StepResult& r) {
    const auto& t = cfg_.train;
    const int64_t stages = mesh_->size(parallel::MeshAxis::pp), stage = mesh_->coord(parallel::MeshAxis::pp);
    const int64_t v = model_->num_chunks(), micros = t.grad_accum, rows = t.batch_size * seq_len_;
    const PipeLinks links = pipe_links();
    parallel::Comm& comm = *links.comm;
    const int next = links.next, prev = links.prev;
    const bool attnres = cfg_.model.attnres.enabled();
    const AttnResHops hops = attnres ? attnres_hops() : AttnResHops{};
    const core::DType master = model_->params().precision().master;
    auto global = [&](int64_t chunk) { return chunk * stages + stage; };
    std::vector<std::pair<parallel::CommWork, core::Tensor>> sends;  // in flight: the work and its buffer
    auto send = [&](const core::Tensor& x, int peer, int tag) {
        core::Tensor copy = x.clone();  // the chunk's buffers change with its next pass
        sends.emplace_back(comm.send(copy.raw(), copy.nbytes(), parallel::CommType::u8, peer, tag), copy);
    };
    double waited = 0.0, computed = 0.0;
    auto recv = [&](int peer, int tag, core::DType type) {
        const auto start = std::chrono::steady_clock::now();
        core::Tensor x = links.activation(rows, type);
        comm.recv(x.raw(), x.nbytes(), parallel::CommType::u8, peer, tag).wait();
        waited += core::seconds_since(start);
        return x;
    };
    std::map<std::pair<int64_t, int64_t>, core::Tensor> inputs;  // (chunk, micro) in flight: its input
    std::map<int64_t, nn::AttnResCarry> carries;                 // AttnRes: per micro-batch in flight
    std::pair<int64_t, int64_t> live{-1, -1};                    // whose activations the blocks hold
    // Chunk 0's forward on micro-batch m (the first stage): m's images for the vision tower.
    auto images_for = [&](int c, int64_t m) {
        if (model_->vision() != nullptr && model_->chunk_has_embedding(c))
            model_->set_vision_batch(m < std::ssize(step_images_) ? step_images_[static_cast<size_t>(m)]
                                                                  : nn::VisionBatch{});
    };
    double loss = 0.0;
    for (const parallel::PipeOp& op : parallel::pipeline_schedule(stages, stage, v, micros)) {
        const int c = static_cast<int>(op.chunk);
        const int64_t m = op.micro, g = global(op.chunk);
        const core::Tensor ids = step_inputs_.select(0, m), targets = step_targets_.select(0, m);
        const bool first = model_->chunk_has_embedding(c), last = model_->chunk_has_head(c);
        nn::AttnResCarry* carry = attnres ? &carries[m] : nullptr;
        beat_phase(op.forward ? Phase::forward : Phase::backward);
        model_->set_attnres_carry(carry);
        if (op.forward) {
            core::Tensor input;
            if (!first && carry) {  // the sources this rank lacks, in hops.into's order
                for (int64_t idx : hops.into(g))
                    carry->values[idx] = recv(prev, pipe_tag(g, m, micros, 0), links.dtype);
            } else if (!first) {
                input = recv(prev, pipe_tag(g, m, micros, 0), links.dtype);
            }
            const auto start = std::chrono::steady_clock::now();
            images_for(c, m);
            const double l = model_->forward_chunk(c, ids, targets, input, true, false);
            computed += core::seconds_since(start);
            inputs[{c, m}] = input;
            live = {c, m};
            r.aux_loss += model_->last_aux_loss() / static_cast<double>(micros);  // this chunk's MoE layers
            if (last) {
                loss += l * weights[static_cast<size_t>(m)] / static_cast<double>(micros);
            } else if (carry) {
                for (int64_t idx : hops.into(g + 1)) send(carry->values.at(idx), next, pipe_tag(g + 1, m, micros, 0));
            } else {
                send(model_->chunk_output(), next, pipe_tag(g + 1, m, micros, 0));
            }
            continue;
        }
        core::Tensor d_output;
        if (!last && carry) {  // the gradients of the sources sent on, added to what this rank's later chunks left
            for (int64_t idx : hops.into(g + 1)) {
                const core::Tensor d = recv(next, pipe_tag(g, m, micros, 1), master);
                core::Tensor& acc = carry->grads[idx];
                if (acc.defined())
                    ops::add_fwd(acc, d, acc);
                else
                    acc = d;
            }
        } else if (!last) {
            d_output = recv(next, pipe_tag(g, m, micros, 1), links.dtype);
        }
        const auto start = std::chrono::steady_clock::now();
        if (live != std::pair<int64_t, int64_t>{c, m}) {
            images_for(c, m);
            model_->forward_chunk(c, ids, targets, inputs.at({c, m}), true, /*recompute=*/true);
        }
        model_->backward_chunk(grad_scale * weights[static_cast<size_t>(m)], d_output);
        computed += core::seconds_since(start);
        live = {-1, -1};  // the backward frees what the recompute policies drop
        inputs.erase({c, m});
        if (!first && carry) {
            // The received sources' gradients go back; the next ones this rank sends for them (without the cache,
            // where its earlier chunks received them too) start from zero. With the cache no earlier chunk of this
            // rank reads them: their values go too.
            for (int64_t idx : hops.into(g)) {
                send(carry->grads.at(idx), prev, pipe_tag(g - 1, m, micros, 1));
                carry->grads.erase(idx);
                if (hops.cache) carry->values.erase(idx);
            }
        } else if (!first) {
            send(model_->chunk_input_grad(), prev, pipe_tag(g - 1, m, micros, 1));
        }
        if (carry && c == 0) carries.erase(m);  // this rank's first chunk: the micro-batch is done here
    }
    model_->set_attnres_carry(nullptr);
    for (auto& [work, buffer] : sends) work.wait();
    r.pp_bubble = parallel::pipeline_bubble(stages, v, micros);
    r.pp_wait_seconds = waited;
    r.pp_compute_seconds = computed;
    // One gather over the pipeline: each stage's times (reported per stage), its MoE layers' aux loss and the last
    // stage's loss (both summed over the stages, in stage order).
    const std::array<double, 4> mine = {waited, computed, r.aux_loss, loss};
    std::vector<double> all(mine.size() * static_cast<size_t>(stages));
    mesh_->group(parallel::MeshGroup::pp)
        .all_gather(mine.data(), all.data(), static_cast<int64_t>(mine.size()), parallel::CommType::f64)
        .wait();
    r.pp_stage_wait_seconds.assign(static_cast<size_t>(stages), 0.0);
    r.pp_stage_compute_seconds.assign(static_cast<size_t>(stages), 0.0);
    r.aux_loss = loss = 0.0;
    for (size_t s = 0; s < static_cast<size_t>(stages); ++s) {
        r.pp_stage_wait_seconds[s] = all[4 * s];
        r.pp_stage_compute_seconds[s] = all[4 * s + 1];
        r.aux_loss += all[4 * s + 2];
        loss += all[4 * s + 3];
    }
    return loss;
}

double Trainer::pipeline_evaluate(const core::Tensor& ids, const core::Tensor& targets) {
    // Every chunk in model order: each stage receives, runs and sends on, the last one computes the loss. The first
    // stage's vision tower encodes the images the caller set (eval_forward).
    const PipeLinks links = pipe_links();
    parallel::Comm& comm = *links.comm;
    const int64_t stages = mesh_->size(parallel::MeshAxis::pp), stage = mesh_->coord(parallel::MeshAxis::pp);
    const bool attnres = cfg_.model.attnres.enabled();
    const AttnResHops hops = attnres ? attnres_hops() : AttnResHops{};
    nn::AttnResCarry carry;
    model_->set_attnres_carry(attnres ? &carry : nullptr);
    auto recv = [&] {
        core::Tensor x = links.activation(ids.numel());
        comm.recv(x.raw(), x.nbytes(), parallel::CommType::u8, links.prev, 0).wait();
        return x;
    };
    auto send = [&](const core::Tensor& x) {
        comm.send(x.raw(), x.nbytes(), parallel::CommType::u8, links.next, 0).wait();
    };
    double loss = 0.0;
    for (int c = 0; c < model_->num_chunks(); ++c) {
        const int64_t g = c * stages + stage;
        core::Tensor input;
        if (!model_->chunk_has_embedding(c) && attnres) {
            for (int64_t idx : hops.into(g)) carry.values[idx] = recv();
        } else if (!model_->chunk_has_embedding(c)) {
            input = recv();
        }
        const double l = model_->forward_chunk(c, ids, targets, input, /*training=*/false, false);
        if (model_->chunk_has_head(c))
            loss = l;
        else if (attnres)
            for (int64_t idx : hops.into(g + 1)) send(carry.values.at(idx));
        else
            send(model_->chunk_output());
    }
    model_->set_attnres_carry(nullptr);
    return parallel::comm_all_reduce_sum(mesh_->group(parallel::MeshGroup::pp), loss);
}

void Trainer::pipeline_reduce_tied_embedding() {
    if (!tied_embedding_) return;
    const int embed = model_->embedding_param();
    MT_CHECK(embed >= 0, "tied embeddings: this pipeline stage holds no copy of the embedding");
    parallel::comm_all_reduce_through_host(*tied_embedding_, model_->params().grad(embed));
}

}  // namespace mt::train
