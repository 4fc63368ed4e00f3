// The uneven all-to-all case both communicator backends' tests run (comm_mpi_test, comm_nccl_test): rank r sends
// (r + d) % 3 elements to rank d (some zero), each encoding (source, destination, index), so a received element
// shows where it came from and where it should have landed.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <vector>

namespace mt::testing {

struct UnevenAllToAll {
    int rank, size;
    std::vector<int64_t> send_counts, recv_counts;
    std::vector<int32_t> send;

    UnevenAllToAll(int r, int n)
        : rank(r), size(n), send_counts(static_cast<size_t>(n)), recv_counts(static_cast<size_t>(n)) {
        for (int d = 0; d < n; ++d) {
            send_counts[static_cast<size_t>(d)] = count(r, d);
            recv_counts[static_cast<size_t>(d)] = count(d, r);
            for (int64_t j = 0; j < count(r, d); ++j) send.push_back(static_cast<int32_t>(r * 10000 + d * 100 + j));
        }
    }
    static int64_t count(int src, int dst) {
        return static_cast<int64_t>((src + dst) % 3);
    }
    size_t recv_total() const {
        return static_cast<size_t>(std::accumulate(recv_counts.begin(), recv_counts.end(), int64_t{0}));
    }
    // Every source's elements, in source order.
    void expect_received(const std::vector<int32_t>& recv) const {
        size_t at = 0;
        for (int s = 0; s < size; ++s)
            for (int64_t j = 0; j < count(s, rank); ++j) EXPECT_EQ(recv[at++], s * 10000 + rank * 100 + j);
    }
};

}  // namespace mt::testing
