// The current execution context: a process default and a per-thread override (ExecScope).
#include "core/exec.h"

#include "core/backend.h"

namespace mt::core {

namespace {

ExecCtx g_default;                                // set once at startup, before any op runs
thread_local const ExecCtx* t_current = nullptr;  // the innermost ExecScope of this thread, or none

}  // namespace

const ExecCtx& exec() {
    return t_current != nullptr ? *t_current : g_default;
}

void set_default_exec(const ExecCtx& ctx) {
    g_default = ctx;
}

const ExecCtx& default_exec() {
    return g_default;
}

ExecScope::ExecScope(const ExecCtx& ctx) : previous_(t_current), ctx_(ctx) {
    t_current = &ctx_;
}

ExecScope::~ExecScope() {
    t_current = previous_;
}

void lane_wait(Lane waiter, Lane signaller) {
    if (waiter == signaller) return;
    if (Backend* cuda = cuda_backend_instance()) cuda->lane_wait(waiter, signaller);
}

}  // namespace mt::core
