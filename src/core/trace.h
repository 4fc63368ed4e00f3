// Named ranges around ops and layers: NVTX ranges on the GPU (visible in Nsight Systems) and, when switched on, an
// op- and layer-level time profile (bench_train --profile) for machines without a system profiler.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"

namespace mt::core {

// The profile: while enabled, every range synchronises the device at its start and end and adds the wall time
// between them to its name's total. Nested ranges report inclusive times. The synchronisation makes small ops look
// slower than they are (a few microseconds each) and removes any overlap, so the profile is for finding where the
// time goes, never for throughput figures.
void profile_enable(Device device);
void profile_disable();
bool profile_enabled();

struct ProfileEntry {
    std::string name;
    double ms = 0;  // total over all calls
    int64_t calls = 0;
};
// The totals since enabling (or the last take), largest first; clears them.
std::vector<ProfileEntry> profile_take();

// Kernel-level tuning aids, off by default and never part of an op's contract, are switched on by one environment
// variable, MT_PROFILE, a comma-separated list of names: kda (cudaEvents around each kernel of a KDA call, printed
// to stderr), kda_phases (clock64 stamps at the phase boundaries inside the KDA kernels). Whether `name` is listed;
// read at every call (a profile is switched per run, and a test may set it).
bool profile_requested(std::string_view name);

// Called by TraceRange and by the CUDA ops' NvtxRange; no-ops unless the profile is enabled.
void profile_begin(const char* name);
void profile_end();

// A range for the lifetime of the object: an NVTX range when the device is a GPU, and a profile entry. `name` must
// outlive the range (a literal, or a string owned by the layer).
class TraceRange {
   public:
    TraceRange(Device device, const char* name);
    ~TraceRange();
    TraceRange(const TraceRange&) = delete;
    TraceRange& operator=(const TraceRange&) = delete;

   private:
    Device device_;
};

}  // namespace mt::core
