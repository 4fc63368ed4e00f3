// The vision encoder's and projector's ops against an independent PyTorch implementation of multimodal.md §1-§2
// (tools/reference/vision_ops.py; multimodal.md §9 test 1): the pixel shuffle and its inverse bitwise equal to a
// reshape/permute per image; layernorm (F.layer_norm), gelu (F.gelu) and rope2d (written in torch from its definition)
// forward and backward within rho <= 1e-5 in f32 and 1e-12 in f64; bilinear_resize (the learned position table,
// F.interpolate bilinear with align_corners=False) forward and backward to the same budgets. Needs Debian's
// python3-torch (MT_REFERENCE_PYTHON overrides /usr/bin/python3); without it the tests fail with the install hint, as
// the Muon golden test does.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "image_grids.h"
#include "op_harness.h"
#include "ops/bilinear_resize.h"
#include "ops/gelu.h"
#include "ops/layernorm.h"
#include "ops/pixel_shuffle.h"
#include "ops/rope2d.h"
#include "support/rho.h"
#include "support/tiny_job.h"

namespace mt::ops::test {
namespace {

std::vector<double> values(const Tensor& t) {
    std::vector<double> v(static_cast<size_t>(t.numel()));
    for (int64_t i = 0; i < t.numel(); ++i) v[static_cast<size_t>(i)] = core::tensor_get_flat(t, i);
    return v;
}

std::vector<int32_t> ints(const Tensor& t) {
    return std::vector<int32_t>(t.data<int32_t>(), t.data<int32_t>() + t.numel());
}

// The reference's flat values as a tensor of `like`'s shape and dtype.
Tensor from_json(const nlohmann::json& v, const Tensor& like) {
    const std::vector<double> flat = v.get<std::vector<double>>();
    EXPECT_EQ(static_cast<int64_t>(flat.size()), like.numel());
    Tensor t = op_like(like);
    for (int64_t i = 0; i < t.numel() && i < static_cast<int64_t>(flat.size()); ++i)
        core::tensor_set_flat(t, i, flat[static_cast<size_t>(i)]);
    return t;
}

// Runs tools/reference/vision_ops.py on the job and returns its output.
nlohmann::json run_reference(const nlohmann::json& job, const std::string& tag) {
    const char* env = std::getenv("MT_REFERENCE_PYTHON");
    const std::string python = env != nullptr ? env : "/usr/bin/python3";
    const std::string dir = mt::testing::fresh_dir(tag);
    std::ofstream(dir + "/in.json") << job.dump();
    const std::string cmd =
        python + " " + MT_SOURCE_DIR + "/tools/reference/vision_ops.py " + dir + "/in.json " + dir + "/out.json";
    EXPECT_EQ(std::system(cmd.c_str()), 0)
        << cmd << " failed. HINT: install Debian's python3-torch (apt-get install python3-torch), or point "
        << "MT_REFERENCE_PYTHON at a Python that has torch";
    std::ifstream in(dir + "/out.json");
    if (!in) return nlohmann::json::object();
    return nlohmann::json::parse(in);
}

void expect_rho(const Tensor& got, const Tensor& ref, double budget, const std::string& what) {
    const double r = mt::testing::rho(got, ref);
    EXPECT_LE(r, budget) << what;
    std::printf("vision ops golden %s: rho %.2e\n", what.c_str(), r);
}

// layernorm, gelu and rope2d in `dtype` on a few odd shapes, each forward and backward against PyTorch.
void check_smooth_ops(DType dtype, double budget) {
    const std::string tag(core::dtype_name(dtype));
    struct Ln {
        int64_t n, c;
        double eps;
    };
    const std::vector<Ln> lns = {{7, 5, 1e-5}, {33, 64, 1e-6}, {5, 257, 1e-5}};
    const std::vector<Shape> gelus = {{1000}, {17, 33}};
    struct Rope {
        ImageGrids grids;
        int64_t h, d;
        double theta;
    };
    const std::vector<Rope> ropes = {
        {{{4, 6}, {2, 10}}, 3, 16, kRope2dTheta}, {{{16, 12}}, 4, 72, kRope2dTheta}, {{{6, 6}, {2, 4}}, 2, 12, 100.0}};
    nlohmann::json job = {{"dtype", tag}};
    struct LnRun {
        Tensor x, w, b, dy;
    };
    std::vector<LnRun> ln_runs;
    for (size_t k = 0; k < lns.size(); ++k) {
        const auto [n, c, eps] = lns[k];
        LnRun r{op_randn({n, c}, 60 + k, 0, 0.5, 2.0).to(dtype),
                op_randn({c}, 60 + k, 1, 1.0, 0.3).to(dtype),
                op_randn({c}, 60 + k, 2).to(dtype),
                op_randn({n, c}, 60 + k, 3).to(dtype)};
        job["layernorm"].push_back({{"n", n},
                                    {"c", c},
                                    {"eps", eps},
                                    {"x", values(r.x)},
                                    {"weight", values(r.w)},
                                    {"bias", values(r.b)},
                                    {"dy", values(r.dy)}});
        ln_runs.push_back(r);
    }
    std::vector<std::pair<Tensor, Tensor>> gelu_runs;  // (x, dy)
    for (size_t k = 0; k < gelus.size(); ++k) {
        const Tensor x = op_randn(gelus[k], 70 + k, 0, 0.0, 3.0).to(dtype),
                     dy = op_randn(gelus[k], 70 + k, 1).to(dtype);
        job["gelu"].push_back({{"x", values(x)}, {"dy", values(dy)}});
        gelu_runs.emplace_back(x, dy);
    }
    std::vector<std::pair<Tensor, Tensor>> rope_runs;  // (x, dy)
    for (size_t k = 0; k < ropes.size(); ++k) {
        const Rope& rp = ropes[k];
        const int64_t t = grids_patches(rp.grids);
        const auto [rows, cols] = grid_positions(rp.grids);
        const Tensor x = op_randn({t, rp.h, rp.d}, 80 + k, 0).to(dtype),
                     dy = op_randn({t, rp.h, rp.d}, 80 + k, 1).to(dtype);
        job["rope2d"].push_back({{"t", t},
                                 {"h", rp.h},
                                 {"d", rp.d},
                                 {"theta", rp.theta},
                                 {"rows", ints(rows)},
                                 {"cols", ints(cols)},
                                 {"x", values(x)},
                                 {"dy", values(dy)}});
        rope_runs.emplace_back(x, dy);
    }
    const nlohmann::json out = run_reference(job, tag);
    ASSERT_TRUE(out.contains("layernorm")) << "no reference output";
    for (size_t k = 0; k < lns.size(); ++k) {
        const LnRun& r = ln_runs[k];
        const std::string what = fmt::format("{} layernorm n{} c{}", tag, lns[k].n, lns[k].c);
        const Tensor y = op_like(r.x), mean = op_stat_like(r.x, {lns[k].n}), rstd = op_like(mean);
        const Tensor dx = op_like(r.x), dw = op_like(r.w), db = op_like(r.b);
        layernorm_fwd(r.x, r.w, r.b, lns[k].eps, y, mean, rstd);
        layernorm_bwd(r.x, r.w, mean, rstd, r.dy, dx, dw, db);
        const nlohmann::json& ref = out["layernorm"][k];
        expect_rho(y, from_json(ref["y"], y), budget, what + " y");
        expect_rho(dx, from_json(ref["dx"], dx), budget, what + " dx");
        expect_rho(dw, from_json(ref["dweight"], dw), budget, what + " dweight");
        expect_rho(db, from_json(ref["dbias"], db), budget, what + " dbias");
    }
    for (size_t k = 0; k < gelus.size(); ++k) {
        const auto& [x, dy] = gelu_runs[k];
        const std::string what = fmt::format("{} gelu {}", tag, core::shape_str(x.shape()));
        const Tensor y = op_like(x), dx = op_like(x);
        gelu_fwd(x, y);
        gelu_bwd(x, dy, dx);
        expect_rho(y, from_json(out["gelu"][k]["y"], y), budget, what + " y");
        expect_rho(dx, from_json(out["gelu"][k]["dx"], dx), budget, what + " dx");
    }
    for (size_t k = 0; k < ropes.size(); ++k) {
        const auto& [x, dy] = rope_runs[k];
        const auto [rows, cols] = grid_positions(ropes[k].grids);
        const std::string what = fmt::format("{} rope2d {} theta {}", tag, core::shape_str(x.shape()), ropes[k].theta);
        const Tensor y = op_like(x), dx = op_like(x);
        rope2d_fwd(x, rows, cols, y, ropes[k].theta);
        rope2d_bwd(dy, rows, cols, dx, ropes[k].theta);
        expect_rho(y, from_json(out["rope2d"][k]["y"], y), budget, what + " y");
        expect_rho(dx, from_json(out["rope2d"][k]["dx"], dx), budget, what + " dx");
    }
}

TEST(VisionOpsGolden, LayernormGeluRope2dMatchPyTorchF32) {
    check_smooth_ops(DType::f32, 1e-5);
}

TEST(VisionOpsGolden, LayernormGeluRope2dMatchPyTorchF64) {
    check_smooth_ops(DType::f64, 1e-12);
}

// The pixel shuffle (and its backward, autograd's gradient of the reshape/permute) bit for bit, in f32 and f64; and
// the backward of the forward is the input itself.
TEST(VisionOpsGolden, PixelShuffleIsPyTorchsReshapePermuteBitwise) {
    const std::vector<std::pair<ImageGrids, int64_t>> cases = {
        {{{4, 6}, {2, 2}, {6, 2}}, 3}, {{{16, 12}, {8, 8}}, 64}, {{{2, 2}}, 1}, {{{2, 38}, {10, 4}}, 17}};
    for (DType dtype : {DType::f32, DType::f64}) {
        const std::string tag(core::dtype_name(dtype));
        nlohmann::json job = {{"dtype", tag}};
        std::vector<std::pair<Tensor, Tensor>> runs;  // (x, dy)
        for (size_t k = 0; k < cases.size(); ++k) {
            const auto& [grids, c] = cases[k];
            const int64_t p = grids_patches(grids);
            const Tensor x = op_randn({p, c}, 90 + k, 0).to(dtype), dy = op_randn({p / 4, 4 * c}, 90 + k, 1).to(dtype);
            nlohmann::json g = nlohmann::json::array();
            for (const auto& [h, w] : grids) g.push_back({h, w});
            job["pixel_shuffle"].push_back({{"grids", g}, {"c", c}, {"x", values(x)}, {"dy", values(dy)}});
            runs.emplace_back(x, dy);
        }
        const nlohmann::json out = run_reference(job, "pixel_shuffle_" + tag);
        ASSERT_TRUE(out.contains("pixel_shuffle")) << "no reference output";
        for (size_t k = 0; k < cases.size(); ++k) {
            const auto& [grids, c] = cases[k];
            const auto& [x, dy] = runs[k];
            const Tensor g = grids_tensor(grids);
            const Tensor y = op_like(x, dy.shape()), dx = op_like(x), back = op_like(x);
            pixel_shuffle_fwd(x, g, y);
            pixel_shuffle_bwd(g, dy, dx);
            pixel_shuffle_bwd(g, y, back);
            EXPECT_TRUE(op_same_bytes(y, from_json(out["pixel_shuffle"][k]["y"], y))) << tag << " case " << k << " y";
            EXPECT_TRUE(op_same_bytes(dx, from_json(out["pixel_shuffle"][k]["dx"], dx)))
                << tag << " case " << k << " dx";
            EXPECT_TRUE(op_same_bytes(back, x)) << tag << " case " << k << ": bwd(fwd(x)) != x";
        }
    }
}

// The position table resized to packed grids (up, down, one axis each way, the identity, 1-cell table axes) against
// F.interpolate, forward and the table's gradient, in f32 and f64.
TEST(VisionOpsGolden, BilinearResizeMatchesFInterpolate) {
    struct Case {
        int64_t hm, wm, c;
        ImageGrids grids;
    };
    const std::vector<Case> cases = {{7, 5, 3, {{7, 5}, {3, 4}, {11, 13}, {1, 1}, {14, 2}}},
                                     {32, 32, 16, {{8, 8}, {24, 40}, {32, 32}}},
                                     {1, 3, 2, {{5, 1}, {2, 7}}},
                                     {13, 2, 5, {{26, 1}, {4, 3}}}};
    for (const auto& [dtype, budget] : {std::pair{DType::f32, 1e-5}, std::pair{DType::f64, 1e-12}}) {
        const std::string tag(core::dtype_name(dtype));
        nlohmann::json job = {{"dtype", tag}};
        std::vector<std::pair<Tensor, Tensor>> runs;  // (table, dy)
        for (size_t k = 0; k < cases.size(); ++k) {
            const Case& cs = cases[k];
            const Tensor table = op_randn({cs.hm, cs.wm, cs.c}, 100 + k, 0).to(dtype),
                         dy = op_randn({grids_patches(cs.grids), cs.c}, 100 + k, 1).to(dtype);
            nlohmann::json g = nlohmann::json::array();
            for (const auto& [h, w] : cs.grids) g.push_back({h, w});
            job["bilinear_resize"].push_back({{"hm", cs.hm},
                                              {"wm", cs.wm},
                                              {"c", cs.c},
                                              {"grids", g},
                                              {"table", values(table)},
                                              {"dy", values(dy)}});
            runs.emplace_back(table, dy);
        }
        const nlohmann::json out = run_reference(job, "bilinear_resize_" + tag);
        ASSERT_TRUE(out.contains("bilinear_resize")) << "no reference output";
        for (size_t k = 0; k < cases.size(); ++k) {
            const auto& [table, dy] = runs[k];
            const Tensor g = grids_tensor(cases[k].grids);
            const Tensor y = op_like(table, dy.shape()), dtable = op_like(table);
            bilinear_resize_fwd(table, g, y);
            bilinear_resize_bwd(g, dy, dtable);
            const std::string what = fmt::format("{} bilinear_resize case {}", tag, k);
            expect_rho(y, from_json(out["bilinear_resize"][k]["y"], y), budget, what + " y");
            expect_rho(dtable, from_json(out["bilinear_resize"][k]["dtable"], dtable), budget, what + " dtable");
        }
    }
}

}  // namespace
}  // namespace mt::ops::test
