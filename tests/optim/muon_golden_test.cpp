// Muon against an independent PyTorch implementation of muon.md §1 (tools/reference/muon.py; muon.md §9 test 2): three
// steps on a wide matrix, a tall one and a stack of three expert matrices, with Nesterov and without, and the hybrid
// coefficients: the weights and momentum after them match in f32 (rho <= 1e-6). Needs Debian's python3-torch
// (MT_REFERENCE_PYTHON overrides /usr/bin/python3); without it the test fails with the install hint.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/rng.h"
#include "ops/muon.h"
#include "support/rho.h"
#include "support/tiny_job.h"

namespace mt::ops {
namespace {

using core::DType;
using core::Tensor;

std::vector<float> draw(int64_t n, uint64_t seed, double scale) {
    std::vector<float> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i)
        v[static_cast<size_t>(i)] =
            static_cast<float>(scale * (static_cast<double>(core::rng_u64(seed, 5, i) % 20001) / 10000.0 - 1.0));
    return v;
}

TEST(MuonGolden, MatchesThePyTorchReference) {
    const char* env = std::getenv("MT_REFERENCE_PYTHON");
    const std::string python = env != nullptr ? env : "/usr/bin/python3";
    const std::string dir = mt::testing::fresh_dir("muon_golden");
    const std::vector<std::vector<int64_t>> shapes = {{1, 24, 40}, {1, 40, 24}, {3, 16, 8}};
    for (const MuonHyper h : {MuonHyper{.lr = 0.02, .momentum = 0.95, .nesterov = true, .weight_decay = 0.1},
                              MuonHyper{.lr = 0.03, .momentum = 0.9, .nesterov = false, .weight_decay = 0.0},
                              MuonHyper{.lr = 0.02, .hybrid = true, .scale_factor = 0.3}}) {
        nlohmann::json job = {{"hyper",
                               {{"lr", h.lr},
                                {"momentum", h.momentum},
                                {"nesterov", h.nesterov},
                                {"ns_steps", h.ns_steps},
                                {"hybrid", h.hybrid},
                                {"scale_factor", h.scale_factor},
                                {"weight_decay", h.weight_decay}}},
                              {"cases", nlohmann::json::array()}};
        std::vector<Tensor> ws, ms;
        for (size_t c = 0; c < shapes.size(); ++c) {
            const core::Shape shape = shapes[c];
            const int64_t n = core::shape_numel(shape);
            const std::vector<float> w0 = draw(n, 100 + c, 0.5);
            nlohmann::json grads = nlohmann::json::array();
            const Tensor w = Tensor::borrow(const_cast<float*>(w0.data()), shape, DType::f32).clone();
            const Tensor m = Tensor::zeros(shape, DType::f32);
            for (int step = 0; step < 3; ++step) {
                const std::vector<float> g = draw(n, 200 + 10 * c + step, 1.0);
                grads.push_back(g);
                muon_step(w, Tensor::borrow(const_cast<float*>(g.data()), shape, DType::f32), m, h, 1.0);
            }
            job["cases"].push_back({{"shape", shape}, {"w", w0}, {"grads", grads}});
            ws.push_back(w);
            ms.push_back(m);
        }
        std::ofstream(dir + "/in.json") << job.dump();
        const std::string cmd =
            python + " " + MT_SOURCE_DIR + "/tools/reference/muon.py " + dir + "/in.json " + dir + "/out.json";
        ASSERT_EQ(std::system(cmd.c_str()), 0)
            << cmd << " failed. HINT: install Debian's python3-torch (apt-get install python3-torch), or point "
            << "MT_REFERENCE_PYTHON at a Python that has torch";
        const nlohmann::json out = nlohmann::json::parse(std::ifstream(dir + "/out.json"));
        for (size_t c = 0; c < shapes.size(); ++c) {
            const std::vector<float> w = out["cases"][c]["w"].get<std::vector<float>>();
            const std::vector<float> m = out["cases"][c]["m"].get<std::vector<float>>();
            const core::Shape shape = shapes[c];
            const double rw = mt::testing::rho(ws[c], Tensor::borrow(const_cast<float*>(w.data()), shape, DType::f32));
            const double rm = mt::testing::rho(ms[c], Tensor::borrow(const_cast<float*>(m.data()), shape, DType::f32));
            EXPECT_LE(rw, 1e-6) << "case " << c << (h.hybrid ? " hybrid" : "") << (h.nesterov ? " nesterov" : "");
            EXPECT_LE(rm, 1e-6) << "case " << c;
            std::printf("muon golden case %zu%s: weights rho %.2e, momentum rho %.2e\n",
                        c,
                        h.hybrid     ? " hybrid"
                        : h.nesterov ? " nesterov"
                                     : " plain",
                        rw,
                        rm);
        }
    }
}

}  // namespace
}  // namespace mt::ops
