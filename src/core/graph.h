// CUDA graphs (issue 25 item 7, docs/training.md "CUDA graphs"): the kernels of a piece of host code recorded once
// and replayed with one launch. A replay runs the recorded kernels with the recorded arguments and addresses; the
// host code does not run again, so whoever captures must keep every buffer the work reads or writes alive and in
// place, and every kernel argument the same, for as long as the graph is replayed (or capture again).
#pragma once

#include <cstdint>
#include <functional>

#include "core/dtype.h"

namespace mt::core {

class Backend;

// Whether the device's backend records graphs (CUDA; not the CPU).
bool graphs_supported(Device device);

class CapturedGraph {
   public:
    CapturedGraph() = default;
    ~CapturedGraph();
    CapturedGraph(const CapturedGraph&) = delete;
    CapturedGraph& operator=(const CapturedGraph&) = delete;

    // Runs work on the host while recording what it queues on the device's main lane, replacing the graph held.
    // The recorded kernels do not run: launch() runs them. A synchronisation inside work (a host read of device
    // memory) fails the capture with the backend's error; any exception from work discards the capture and passes on.
    void capture(Device device, const std::function<void()>& work);
    // Queues the graph on the main lane (asynchronous, like a kernel launch).
    void launch() const;
    void reset();
    bool ready() const {
        return graph_ != 0;
    }

   private:
    Backend* backend_ = nullptr;
    uint64_t graph_ = 0;
};

}  // namespace mt::core
