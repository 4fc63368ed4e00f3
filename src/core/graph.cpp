#include "core/graph.h"

#include <exception>

#include "core/backend.h"
#include "core/error.h"

namespace mt::core {

bool graphs_supported(Device device) {
    return backend_available(device) && backend_get(device).supports_graphs();
}

CapturedGraph::~CapturedGraph() {
    try {
        reset();
    } catch (const std::exception&) {  // a destructor does not throw; the device's error shows up at its next call
    }
}

void CapturedGraph::capture(Device device, const std::function<void()>& work) {
    reset();
    Backend& backend = backend_get(device);
    MT_CHECK(backend.supports_graphs(), "the {} backend has no CUDA graphs", backend.name());
    backend.begin_capture();
    try {
        work();
    } catch (...) {
        backend.end_capture(/*keep=*/false);
        throw;
    }
    graph_ = backend.end_capture(/*keep=*/true);
    backend_ = &backend;
}

void CapturedGraph::launch() const {
    MT_CHECK(graph_ != 0, "launch of a CUDA graph that was not captured");
    backend_->graph_launch(graph_);
}

void CapturedGraph::reset() {
    if (graph_ == 0) return;
    const uint64_t graph = graph_;
    graph_ = 0;
    backend_->graph_destroy(graph);
}

}  // namespace mt::core
