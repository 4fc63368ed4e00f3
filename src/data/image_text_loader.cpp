// The image-text prefetch thread (image_text_loader.h).
#include "data/image_text_loader.h"

#include "core/error.h"

namespace mt::data {

ImageTextLoader::ImageTextLoader(Fill fill, int depth) : fill_(std::move(fill)), depth_(depth) {
    MT_CHECK(depth >= 0, "image-text loader depth {} must be >= 0", depth);
    if (depth_ > 0) worker_ = std::thread([this] { run(); });
}

ImageTextLoader::~ImageTextLoader() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stop_ = true;
        jobs_.clear();
    }
    wake_.notify_all();
    if (worker_.joinable()) worker_.join();
}

void ImageTextLoader::run() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
        wake_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
        if (stop_) return;
        const Key key = jobs_.front();
        jobs_.pop_front();
        auto it = slots_.find(key);
        if (it == slots_.end()) continue;  // dropped while queued
        it->second.started = true;
        MultimodalBatch batch;
        if (!spare_.empty()) {
            batch = std::move(spare_.back());
            spare_.pop_back();
        }
        std::exception_ptr error;
        lock.unlock();
        try {
            fill_(key.first, key.second, &batch);
        } catch (...) {
            error = std::current_exception();
        }
        lock.lock();
        it = slots_.find(key);  // the caller may have dropped it meanwhile
        if (it == slots_.end()) continue;
        it->second.batch = std::move(batch);
        it->second.error = error;
        it->second.done = true;
        ready_.notify_all();
    }
}

void ImageTextLoader::get(int64_t first_row, int64_t rows, MultimodalBatch* out) {
    const Key key{first_row, rows};
    std::unique_lock<std::mutex> lock(mutex_);
    auto it = slots_.find(key);
    std::exception_ptr error;
    if (it != slots_.end() && it->second.started) {
        ready_.wait(lock, [&] { return slots_.at(key).done; });
        it = slots_.find(key);
        std::swap(*out, it->second.batch);
        error = it->second.error;
        if (std::ssize(spare_) < depth_) spare_.push_back(std::move(it->second.batch));
        slots_.erase(it);
        ++served_prefetched_;
    } else {
        // Not started (a queued guess, or none): every prefetch older than this request is stale; make it here.
        if (it != slots_.end()) slots_.erase(it);
        for (auto s = slots_.begin(); s != slots_.end();) s = s->second.started ? std::next(s) : slots_.erase(s);
        jobs_.clear();
        lock.unlock();
        try {
            fill_(first_row, rows, out);
        } catch (...) {
            error = std::current_exception();
        }
        lock.lock();
        ++served_inline_;
    }
    // Guess the next requests from the stride, and drop what the guess no longer covers.
    const int64_t stride = has_last_ && last_.second == rows ? first_row - last_.first : 0;
    has_last_ = true;
    last_ = key;
    if (depth_ > 0 && stride > 0) {
        for (auto s = slots_.begin(); s != slots_.end();) {
            const int64_t ahead = s->first.first - first_row;
            const bool wanted = s->first.second == rows && ahead > 0 && ahead % stride == 0 && ahead / stride <= depth_;
            s = wanted ? std::next(s) : slots_.erase(s);
        }
        for (int64_t k = 1; k <= depth_; ++k) {
            const Key next{first_row + k * stride, rows};
            if (slots_.count(next) != 0) continue;
            slots_[next];
            jobs_.push_back(next);
        }
        wake_.notify_all();
    }
    lock.unlock();
    if (error) std::rethrow_exception(error);
}

}  // namespace mt::data
