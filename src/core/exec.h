// The execution context of ops (issue 21 item 5): which stream their kernels, copies and memsets go to, which
// scratch pool they allocate from, and whether they must be deterministic. Each thread runs its ops under one
// current context: the process default unless an ExecScope has made another one current. Ops read it at the call
// (core::exec()); layers and models never pick one, the caller (trainer, communicator, a test) does.
//
// Two lanes: main, where every op runs by default, and side, a second stream for work that should overlap with it
// (expert all-to-all, pipeline and context-parallel transfers). Each lane has its own scratch pool in the CUDA
// backend, so memory freed by one lane is reused only by that lane (stream order keeps the reuse safe); a tensor
// used on both lanes must be ordered with lane_wait by whoever hands it over, as with any two streams. On the CPU
// both lanes are the calling thread. A third lane, copy, carries long device-to-host copies that run beside whole
// steps (the asynchronous checkpoint's snapshots, docs/operations.md) so they never hold up the side lane's
// transfers; it allocates nothing.
#pragma once

namespace mt::core {

enum class Lane { main, side, copy };

struct ExecCtx {
    Lane lane = Lane::main;
    // On (the default): every op gives bitwise identical results run to run (no float atomics, fixed reduction
    // orders). Off (config `run.deterministic = false`): ops may pick faster kernels whose float sums depend on
    // scheduling (the CUDA attention backward accumulates dq with float reductions). CPU ops are always
    // deterministic.
    bool deterministic = true;
    // On: the caller has checked every index the ops read (token ids, targets) on the host, as a captured CUDA graph's
    // step does (core/graph.h), so ops skip their own device-side checks, whose result needs a synchronisation that a
    // capture cannot contain.
    bool indices_checked = false;
};

// The context ops called on this thread run under now.
const ExecCtx& exec();
// The process default, current on every thread outside an ExecScope (the trainer sets it once, before any op runs,
// from the config).
void set_default_exec(const ExecCtx& ctx);
const ExecCtx& default_exec();

// Makes ctx current on this thread until the scope ends (scopes nest; the previous context comes back).
class ExecScope {
   public:
    explicit ExecScope(const ExecCtx& ctx);
    ~ExecScope();
    ExecScope(const ExecScope&) = delete;
    ExecScope& operator=(const ExecScope&) = delete;

   private:
    const ExecCtx* previous_;
    ExecCtx ctx_;
};

// Work queued on lane `waiter` from now on starts after all work queued on lane `signaller` so far (a CUDA event;
// nothing on the CPU).
void lane_wait(Lane waiter, Lane signaller);

}  // namespace mt::core
