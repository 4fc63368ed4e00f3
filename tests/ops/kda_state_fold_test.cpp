// ops::kda_state_fold_fwd / _bwd, the per-head map of context parallelism's KDA state fold
// (src/ops/kda_state_fold.cpp), against the plain loops it replaced, in both directions, on maps laid out as KdaCp
// keeps them ([h | M] rows of V + K columns per head); and the same bits for any thread count.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "ops/kda.h"

namespace mt::ops {
namespace {

struct Fold {
    int64_t heads, k, v;
    std::vector<double> maps, in, own;  // maps [heads, k, v + k]: h then M; in, own [heads, k, v]
    Fold(uint32_t seed, int64_t heads_, int64_t k_, int64_t v_) : heads(heads_), k(k_), v(v_) {
        std::mt19937 rng(seed);
        std::uniform_real_distribution<double> u(-1.0, 1.0);
        maps.resize(static_cast<size_t>(heads * k * (v + k)));
        in.resize(static_cast<size_t>(heads * k * v));
        own.resize(in.size());
        for (double& x : maps) x = u(rng);
        for (double& x : in) x = u(rng);
        for (double& x : own) x = u(rng);
    }
    double m(int64_t h, int64_t i, int64_t j) const {
        return maps[static_cast<size_t>((h * k + i) * (v + k) + v + j)];
    }
    double hmap(int64_t h, int64_t i, int64_t c) const {
        return maps[static_cast<size_t>((h * k + i) * (v + k) + c)];
    }
    double at(const std::vector<double>& x, int64_t h, int64_t i, int64_t c) const {
        return x[static_cast<size_t>((h * k + i) * v + c)];
    }
    std::vector<double> run(bool transpose) const {
        std::vector<double> out(in.size(), -7.0);
        if (transpose)
            kda_state_fold_bwd(heads, k, v, maps.data(), own.data(), in.data(), out.data());
        else
            kda_state_fold_fwd(heads, k, v, maps.data(), in.data(), out.data());
        return out;
    }
};

TEST(KdaStateFold, ForwardIsHPlusMTimesTheState) {
    const Fold f(11, 3, 5, 4);
    const std::vector<double> out = f.run(false);
    for (int64_t h = 0; h < f.heads; ++h)
        for (int64_t i = 0; i < f.k; ++i)
            for (int64_t c = 0; c < f.v; ++c) {
                double want = f.hmap(h, i, c);
                for (int64_t j = 0; j < f.k; ++j) want += f.m(h, i, j) * f.at(f.in, h, j, c);
                EXPECT_NEAR(f.at(out, h, i, c), want, 1e-13) << "head " << h << " row " << i << " col " << c;
            }
}

TEST(KdaStateFold, BackwardIsOwnPlusMTransposedTimesTheGradient) {
    const Fold f(12, 3, 5, 4);
    const std::vector<double> out = f.run(true);
    for (int64_t h = 0; h < f.heads; ++h)
        for (int64_t j = 0; j < f.k; ++j)
            for (int64_t c = 0; c < f.v; ++c) {
                double want = f.at(f.own, h, j, c);
                for (int64_t i = 0; i < f.k; ++i) want += f.m(h, i, j) * f.at(f.in, h, i, c);
                EXPECT_NEAR(f.at(out, h, j, c), want, 1e-13) << "head " << h << " row " << j << " col " << c;
            }
}

TEST(KdaStateFold, SameBitsForAnyThreadCount) {
    const Fold big(13, 16, 64, 64);  // 16 heads of 64 x 64 x 64 multiply-adds: the OpenMP branch
    const int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    const std::vector<double> one_fwd = big.run(false), one_bwd = big.run(true);
    omp_set_num_threads(3);
    const std::vector<double> three_fwd = big.run(false), three_bwd = big.run(true);
    omp_set_num_threads(threads);
    EXPECT_EQ(one_fwd, three_fwd);
    EXPECT_EQ(one_bwd, three_bwd);
    EXPECT_NE(one_fwd, one_bwd);  // the two directions are different maps
}

}  // namespace
}  // namespace mt::ops
