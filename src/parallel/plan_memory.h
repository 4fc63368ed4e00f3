// The memory planner (`moetrain plan --memory`, docs/memory_planning.md): what one rank of a training job holds, on
// its device and, under optimizer offload, in host memory, from the job's settings alone: no GPU, and none of the
// model's arenas or activations allocated (Model::param_layout declares the parameters and lays the table out).
//   state        the parameter arenas and the AdamW moments: exact, the bytes a finalized ParamTable and
//                optim::AdamW allocate (alignment padding included; ZeRO-1 shards the moments over the data ranks)
//   activations  every buffer each layer allocates for one micro-batch (parallel/plan_buffers.h), split by layer type
//                into what stays saved for the backward under the recompute policy, what the layers keep besides,
//                and what the policy frees and rebuilds per layer; the vision tower's for the most image slots a
//                micro-batch can hold (plan_vision)
//   workspace    the shared backward workspace (d_norm, d_tmp and the slots at their largest use)
//   peak         the state, everything held through the step, and the largest transient: one layer's rebuilt
//                activations with the CUDA op scratch inside it (or a recompute-full group's), each allocation
//                rounded to the CUDA caching allocator's size classes; the allocator's figure, which is what
//                bench_train's peak_device_bytes and the mem/peak metric report
// This is the memory half of the planner a later issue builds (the mesh, the schedule).
#pragma once

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "nn/model_config.h"
#include "nn/precision.h"
#include "parallel/mesh.h"
#include "parallel/plan_buffers.h"
#include "parallel/plan_segments.h"

namespace mt::parallel {

// Everything the planner reads; cli/cmd_plan.cpp fills it from a job config.
struct MemoryPlanInput {
    nn::ModelConfig model;
    nn::Precision precision;                     // the run's device and dtypes (trainer_precision's choice)
    int64_t batch = 1, seq = 1;                  // one micro-batch: train.batch_size x train.seq_len
    MeshShape mesh;                              // resolved (mesh_resolve)
    int64_t zero_stage = 1;                      // parallel.zero_stage
    double bucket_mb = 25.0;                     // parallel.bucket_mb
    bool offload = false;                        // optim.offload = "cpu": master weights and moments in host memory
    core::DType state_dtype = core::DType::f32;  // optim.state_dtype: the AdamW moments
    bool deterministic = true;                   // run.deterministic
    // Image batches (model.vision enabled): the most LM tokens one image makes (vision.max_pixels / (2 patch)^2 for
    // images read from disk, the largest canvas of the shapes set) and the fewest other tokens its sample brings (3,
    // or the shortest shapes text and its frame); the tower is planned for the most image slots a micro-batch can hold
    // (plan_image_slots). image_tokens 0: no images, the tower's activations are not planned.
    int64_t image_tokens = 0, image_frame_tokens = 3;
    std::string source = "";  // the config file, for the report
};

// Bytes of one kind of layer's activations on this rank after the forward.
struct MemoryActivations {
    int64_t saved = 0;    // saved for the backward and held (Model::saved_activation_bytes' share)
    int64_t held = 0;     // kept by the layers besides (scratch members, routing counters, gradient buffers)
    int64_t dropped = 0;  // freed after the forward by the recompute policy and rebuilt per layer in the backward
};

// Sequence segments (long.segments, long.segment_tokens; parallel/plan_segments.h): the row runs as `count`
// segments, and the plan's activations, workspace and transient are those of the segment where the peak falls.
struct MemorySegments {
    int64_t count = 1, longest = 0;           // J, and the longest segment's tokens per row
    int64_t peak_index = 0, peak_length = 0;  // the segment whose phase makes the peak
    bool offload = false;                     // long.offload_kv
    std::vector<PlanSegmentBuffer> buffers;   // what crosses the boundaries, held all step
    int64_t device = 0, host = 0;             // their bytes on the device (a CPU run's memory too) and on the host
    int64_t transient_keys = 0;               // of the largest transient: dK, dV scratch and staged key rows (sizes)
};

struct MemoryPlan {
    MemoryPlanInput input;
    // The parameter table on this rank.
    int64_t params_global = 0;  // elements of the model's parameters at their global shapes
    int64_t params_rank = 0;    // elements of this rank's parameter tensors (its experts under expert parallelism)
    int64_t arena_numel = 0;    // arena elements, alignment padding included
    int64_t align = 64;         // every parameter's offset is a multiple of it (elements)
    int64_t buckets = 0;        // gradient buckets (0: no data-parallel reduction)
    int64_t owned_numel = 0;    // arena elements whose moments this rank holds
    bool zero = false;          // ZeRO-1 active (zero_stage >= 1 and more than one rank reads different data)
    // State bytes (exact). master = 0 where the weights are the master weights (f32 training).
    int64_t weights = 0, grads = 0, master = 0, optimizer = 0;
    bool offload = false;  // master and optimizer live in host memory
    // Trainer::state_bytes(): the arenas (each once) and the moments.
    int64_t state_bytes() const {
        return weights + grads + master + optimizer;
    }
    int64_t state_device() const {
        return weights + grads + (offload ? 0 : master + optimizer);
    }
    int64_t state_host() const {
        return offload ? master + optimizer : 0;
    }
    std::array<MemoryActivations, kPlanKinds> activations{};
    int64_t saved_total = 0;   // what Model::saved_activation_bytes() reports after the forward
    int64_t held_total = 0;    // the other buffers held through the step
    int64_t workspace = 0;     // Model::workspace_bytes() once the first backward ran
    int64_t comm = 0;          // ZeRO-1's reduce-scatter staging and the MoE all-to-all buffers
    int64_t zero_staging = 0;  // the first: GradSync's staging of the owned slices' reduced gradients
    int64_t gemm_workspace = 0;
    int64_t transient = 0;  // the largest transient, allocated size classes
    std::string transient_at;
    int64_t rounding = 0;            // at the peak: the size classes' bytes beyond the buffers' own
    int64_t peak = 0;                // predicted peak_device_bytes
    std::vector<std::string> notes;  // what the figures leave out or assume
    MemorySegments segments;
    // The vision tower's micro-batch as planned: image slots and patches (0 without images).
    int64_t vision_tokens = 0, vision_patches = 0;
    // Host memory at the peak: the offloaded optimizer state and the segments' host buffers.
    int64_t host_peak() const {
        return state_host() + segments.host;
    }
};

// The plan of one rank (every rank of a mesh holds the same sizes: the experts and the ZeRO-1 shards split evenly).
MemoryPlan plan_memory(const MemoryPlanInput& input);

// The CUDA caching allocator's size class of a request (core/cuda/cuda_backend.cu): multiples of 512 bytes below
// 1 MiB, of 2 MiB above.
int64_t plan_cuda_size_class(int64_t bytes);

// One JSON object (bytes as integers); the human-readable table (GB = 1e9 bytes).
nlohmann::json memory_plan_json(const MemoryPlan& plan);
std::string memory_plan_table(const MemoryPlan& plan);

}  // namespace mt::parallel
