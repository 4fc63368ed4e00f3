// A background thread that prepares image-text batches ahead of the trainer (decoding, resizing and patchifying
// images costs as much as a small model's step). Batches are pure functions of their (first_row, rows) request, so
// the thread only changes when a batch is made, never what it holds: the trainer gets the same batches, and the same
// errors, as if it filled them itself.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "data/multimodal_batch.h"

namespace mt::data {

class ImageTextLoader {
   public:
    // Fills the batch of a request; must be deterministic and safe to call from another thread.
    using Fill = std::function<void(int64_t first_row, int64_t rows, MultimodalBatch* out)>;

    // Starts the worker thread. depth: how many batches it may hold ready or in progress (the bound of the queue);
    // 0 runs every request on the caller's thread.
    // @param[in] fill   the batch maker (ImageTextRows::fill)
    // @param[in] depth  prefetched batches, >= 0
    ImageTextLoader(Fill fill, int depth = 2);
    // Stops the worker: a batch in progress is finished and dropped.
    ~ImageTextLoader();
    ImageTextLoader(const ImageTextLoader&) = delete;
    ImageTextLoader& operator=(const ImageTextLoader&) = delete;

    // The batch of rows [first_row, first_row + rows). When the worker has it ready (or in progress) it is taken
    // (waiting for it); otherwise it is made on this thread and prefetches that are no longer wanted are dropped.
    // Then the worker is given the next requests, predicted by the stride between this request and the last one
    // (the trainer reads rows at a fixed stride: first_row + k * world * batch). An error the fill threw, on either
    // thread, is rethrown here, for the request that hit it. A prefetched batch is swapped into *out, and out's old
    // buffers go back to the worker to be filled again: reused memory, not ~2.4 MB of fresh pages per 448^2 image
    // (page faults that made the worker's fill 2.5x the caller's on the development machine).
    // @param[in]  first_row  stream row of the batch's row 0
    // @param[in]  rows       rows of the batch
    // @param[in,out] out     the batch; what it held is reused
    void get(int64_t first_row, int64_t rows, MultimodalBatch* out);

    // Batches served from the worker's prefetch, and made on the caller's thread (tests; a wrong guess costs one).
    int64_t served_prefetched() const {
        return served_prefetched_;
    }
    int64_t served_inline() const {
        return served_inline_;
    }

   private:
    using Key = std::pair<int64_t, int64_t>;  // (first_row, rows)
    struct Slot {
        bool started = false;
        bool done = false;
        MultimodalBatch batch;
        std::exception_ptr error;
    };
    void run();

    Fill fill_;
    int depth_;
    std::mutex mutex_;
    std::condition_variable wake_;        // the worker: a new job or stop
    std::condition_variable ready_;       // the caller: a slot is done
    std::deque<Key> jobs_;                // in request order, each with a slot
    std::map<Key, Slot> slots_;           // wanted batches: queued, in progress or done
    std::vector<MultimodalBatch> spare_;  // buffers handed back by get, filled again by the worker (at most depth)
    bool stop_ = false;
    bool has_last_ = false;
    Key last_{0, 0};
    int64_t served_prefetched_ = 0, served_inline_ = 0;
    std::thread worker_;
};

}  // namespace mt::data
