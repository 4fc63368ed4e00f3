// Image fit size, bilinear resize and patch cut (multimodal.md §1); the rules are in image_prep.h.
#include "data/image_prep.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace mt::data {

ImageSize image_fit_size(int height, int width, int64_t min_pixels, int64_t max_pixels, int multiple) {
    MT_CHECK(height >= 1 && width >= 1, "image size {}x{} must be positive", height, width);
    MT_CHECK(multiple >= 1, "image side multiple {} must be positive", multiple);
    const int64_t unit = int64_t{multiple} * multiple;
    // In units of multiple^2: any a x b with lo <= a*b <= hi fits, and a = 1, b = lo is one when lo <= hi.
    const int64_t lo = std::max<int64_t>(1, (min_pixels + unit - 1) / unit);
    const int64_t hi = max_pixels / unit;
    MT_CHECK(min_pixels <= max_pixels && lo <= hi,
             "no image size with sides multiples of {} has an area in [min_pixels {}, max_pixels {}]",
             multiple,
             min_pixels,
             max_pixels);
    const double area = double(height) * double(width);
    double s = 1.0;
    if (area > double(max_pixels)) s = std::sqrt(double(max_pixels) / area);
    if (area < double(min_pixels)) s = std::sqrt(double(min_pixels) / area);
    const double h_ideal = s * height / multiple;
    const double w_ideal = s * width / multiple;
    int64_t a = std::max<int64_t>(1, static_cast<int64_t>(std::floor(h_ideal + 0.5)));
    int64_t b = std::max<int64_t>(1, static_cast<int64_t>(std::floor(w_ideal + 0.5)));
    // No side can exceed hi units (the other is at least 1); clamping first keeps the loops short for strips.
    a = std::min(a, hi);
    b = std::min(b, hi);
    // Whether a1 x b1 keeps the source aspect H:W at least as well as a2 x b2. The error of a x b is
    // max(aW, bH) / min(aW, bH), compared by cross-multiplying in 128 bits so ties are exact.
    auto keeps_aspect = [&](int64_t a1, int64_t b1, int64_t a2, int64_t b2) {
        using I = __int128;
        const I x1 = I{a1} * width, y1 = I{b1} * height, x2 = I{a2} * width, y2 = I{b2} * height;
        return std::max(x1, y1) * std::min(x2, y2) <= std::max(x2, y2) * std::min(x1, y1);
    };
    while (a * b > hi) {
        if (a > 1 && (b == 1 || keeps_aspect(a - 1, b, a, b - 1))) {
            --a;
        } else {
            --b;
        }
    }
    while (a * b < lo) {
        const bool grow_a_fits = (a + 1) * b <= hi;
        const bool grow_b_fits = a * (b + 1) <= hi;
        MT_CHECK(grow_a_fits || grow_b_fits,
                 "image {}x{}: {}x{} is below min_pixels {} and one more row or column of {} passes max_pixels {}; "
                 "widen [vision.min_pixels, vision.max_pixels]",
                 height,
                 width,
                 a * multiple,
                 b * multiple,
                 min_pixels,
                 multiple,
                 max_pixels);
        if (grow_a_fits && (!grow_b_fits || keeps_aspect(a + 1, b, a, b + 1))) {
            ++a;
        } else {
            ++b;
        }
    }
    MT_CHECK(a * multiple <= (1 << 30) && b * multiple <= (1 << 30), "fit size {}x{} overflows", a, b);
    return ImageSize{static_cast<int>(a * multiple), static_cast<int>(b * multiple)};
}

namespace {

// Source index pair and weight of the far one for output coordinate d of a resize from n to n2 samples.
struct Tap {
    int i0, i1;
    double w1;
};

std::vector<Tap> resize_taps(int n, int n2) {
    std::vector<Tap> taps(static_cast<size_t>(n2));
    const double scale = double(n) / double(n2);
    for (int d = 0; d < n2; ++d) {
        const double src = std::max(0.0, (d + 0.5) * scale - 0.5);
        const int i0 = std::min(static_cast<int>(std::floor(src)), n - 1);
        taps[static_cast<size_t>(d)] = Tap{i0, std::min(i0 + 1, n - 1), src - i0};
    }
    return taps;
}

}  // namespace

std::vector<uint8_t> image_resize_bilinear(const uint8_t* rgb, int height, int width, int height2, int width2) {
    MT_CHECK(height >= 1 && width >= 1 && height2 >= 1 && width2 >= 1,
             "bilinear resize {}x{} -> {}x{}: sizes must be positive",
             height,
             width,
             height2,
             width2);
    // The same size is the identity (every tap lands on a pixel centre with weight 1): the bytes as they are, without
    // the per-pixel double arithmetic, which cost as much as decoding a PNG (bench_image_loader).
    if (height2 == height && width2 == width)
        return std::vector<uint8_t>(rgb, rgb + static_cast<size_t>(height) * width * 3);
    const std::vector<Tap> ty = resize_taps(height, height2);
    const std::vector<Tap> tx = resize_taps(width, width2);
    std::vector<uint8_t> out(static_cast<size_t>(height2) * width2 * 3);
    auto px = [&](int y, int x, int c) { return double(rgb[(static_cast<size_t>(y) * width + x) * 3 + c]); };
    for (int y = 0; y < height2; ++y) {
        const Tap& v = ty[static_cast<size_t>(y)];
        for (int x = 0; x < width2; ++x) {
            const Tap& u = tx[static_cast<size_t>(x)];
            for (int c = 0; c < 3; ++c) {
                // Rows first, then columns, always in this order, so the double result is reproducible.
                const double top = (1.0 - u.w1) * px(v.i0, u.i0, c) + u.w1 * px(v.i0, u.i1, c);
                const double bottom = (1.0 - u.w1) * px(v.i1, u.i0, c) + u.w1 * px(v.i1, u.i1, c);
                const double value = (1.0 - v.w1) * top + v.w1 * bottom;
                out[(static_cast<size_t>(y) * width2 + x) * 3 + c] =
                    static_cast<uint8_t>(std::clamp(std::floor(value + 0.5), 0.0, 255.0));
            }
        }
    }
    return out;
}

int64_t image_patch_values(int patch) {
    return int64_t{patch} * patch * 3;
}

void image_patchify(const uint8_t* rgb, int height, int width, const ImagePatchOptions& options, float* out) {
    const int p = options.patch;
    MT_CHECK(p >= 1, "patch size {} must be positive", p);
    MT_CHECK(height > 0 && width > 0 && height % (2 * p) == 0 && width % (2 * p) == 0,
             "image {}x{}: both sides must be positive multiples of {} (an even grid of {}-pixel patches)",
             height,
             width,
             2 * p,
             p);
    for (int c = 0; c < 3; ++c) MT_CHECK(options.std[c] != 0.0f, "image std of channel {} is 0", c);
    const int grid_w = width / p;
    const int64_t values = image_patch_values(p);
    for (int y = 0; y < height; ++y) {
        const int i = y / p, r = y % p;
        for (int x = 0; x < width; ++x) {
            const int j = x / p, col = x % p;
            float* dst = out + (int64_t{i} * grid_w + j) * values + (int64_t{r} * p + col) * 3;
            const uint8_t* src = rgb + (static_cast<size_t>(y) * width + x) * 3;
            for (int c = 0; c < 3; ++c) dst[c] = (float(src[c]) / 255.0f - options.mean[c]) / options.std[c];
        }
    }
}

}  // namespace mt::data
