// Shapes rasteriser. All geometry is in integers of 1/122880 pixel (120 * 1024: cell edges W/3, radii min(W,H)/15
// and /7.5, quarter-pixel samples and the 1024 jitter steps are all whole numbers in that unit), measured from the
// canvas center. So there is no floating point to round differently on another platform or compiler, and mirroring
// a scene negates every x coordinate exactly, which makes the flipped image bitwise equal to the flipped scene's.
#include <algorithm>
#include <bit>

#include "core/error.h"
#include "core/rng.h"
#include "data/shapes.h"

namespace mt::data {

namespace {

constexpr int64_t kUnit = 120 * kShapesJitterSteps;  // units per pixel
constexpr uint64_t kNoiseStream = 0x53484E4Fu;       // "SHNO"
constexpr int kBackground = 16;
constexpr int kNoiseLevels = 17;  // noise in -8..8
constexpr int kMaxSide = 4096;

// An object's center relative to the canvas center and its radius, in units.
struct Box {
    int64_t cx, cy, r;
};

Box object_box(const ShapeObject& o, int height, int width) {
    MT_CHECK(o.cell >= 0 && o.cell < kShapeCells, "object cell {} outside 0..8", o.cell);
    MT_CHECK(o.jitter_x >= 0 && o.jitter_x <= kShapesJitterSteps && o.jitter_y >= 0 && o.jitter_y <= kShapesJitterSteps,
             "object jitter ({}, {}) outside 0..{}",
             o.jitter_x,
             o.jitter_y,
             kShapesJitterSteps);
    const int64_t cw = width * kUnit / 3, ch = height * kUnit / 3;
    const int64_t r = std::min(cw, ch) / 5 * (o.size == ShapeSize::large ? 2 : 1);  // 0.2 or 0.4 of the cell
    // Half the free room per jitter step: the box spans the cell edge to edge as jitter goes 0..1024.
    const int64_t step_x = (cw - 2 * r) / (2 * kShapesJitterSteps);
    const int64_t step_y = (ch - 2 * r) / (2 * kShapesJitterSteps);
    const int64_t col = o.cell % 3 - 1, row = o.cell / 3 - 1;
    return {col * cw + (2 * o.jitter_x - kShapesJitterSteps) * step_x,
            row * ch + (2 * o.jitter_y - kShapesJitterSteps) * step_y,
            r};
}

// Whether the point (dx, dy) from the center (y down) is inside the shape; each test depends on |dx| only, so
// every shape is exactly mirror symmetric.
bool inside(ShapeKind kind, int64_t dx, int64_t dy, int64_t r) {
    const int64_t ax = dx < 0 ? -dx : dx, ay = dy < 0 ? -dy : dy;
    switch (kind) {
        case ShapeKind::circle:
            return dx * dx + dy * dy <= r * r;
        case ShapeKind::square:
            return ax <= r && ay <= r;
        case ShapeKind::triangle:  // apex (0, -r), base from (-r, r) to (r, r)
            return dy <= r && 2 * ax <= dy + r;
        case ShapeKind::cross:  // a plus sign, arms 2r long and 2r/3 wide
            return (ax <= r && 3 * ay <= r) || (3 * ax <= r && ay <= r);
    }
    return false;
}

}  // namespace

ShapeGeometry shapes_object_geometry(const ShapeObject& object, int height, int width) {
    const Box b = object_box(object, height, width);
    const double u = static_cast<double>(kUnit);
    return {static_cast<double>(width * kUnit / 2 + b.cx) / u,
            static_cast<double>(height * kUnit / 2 + b.cy) / u,
            static_cast<double>(b.r) / u};
}

ShapesImage shapes_render(const ShapesScene& scene, int height, int width) {
    MT_CHECK(height >= 1 && height <= kMaxSide && width >= 1 && width <= kMaxSide,
             "shapes render size {}x{} outside 1..{}",
             height,
             width,
             kMaxSide);
    const size_t pixels = static_cast<size_t>(height) * static_cast<size_t>(width);
    // Per pixel: which of its 4 samples an object covers, and the summed colors of the covered samples.
    std::vector<uint8_t> covered(pixels, 0);
    std::vector<uint16_t> color_sum(pixels * 3, 0);
    const int64_t half_w = width * kUnit / 2, half_h = height * kUnit / 2;
    for (const ShapeObject& o : scene.objects) {
        const Box b = object_box(o, height, width);
        const auto rgb = shapes_color_rgb(o.color);
        const int64_t x0 = std::max<int64_t>(0, (half_w + b.cx - b.r) / kUnit - 1);
        const int64_t x1 = std::min<int64_t>(width - 1, (half_w + b.cx + b.r) / kUnit + 1);
        const int64_t y0 = std::max<int64_t>(0, (half_h + b.cy - b.r) / kUnit - 1);
        const int64_t y1 = std::min<int64_t>(height - 1, (half_h + b.cy + b.r) / kUnit + 1);
        for (int64_t y = y0; y <= y1; ++y) {
            for (int64_t x = x0; x <= x1; ++x) {
                uint8_t bits = 0;
                for (int sy = 0; sy < 2; ++sy)
                    for (int sx = 0; sx < 2; ++sx) {
                        const int64_t px = x * kUnit + kUnit / 4 + sx * (kUnit / 2) - half_w;
                        const int64_t py = y * kUnit + kUnit / 4 + sy * (kUnit / 2) - half_h;
                        if (inside(o.kind, px - b.cx, py - b.cy, b.r)) bits |= static_cast<uint8_t>(1 << (2 * sy + sx));
                    }
                if (bits == 0) continue;
                const size_t p = static_cast<size_t>(y * width + x);
                MT_CHECK((covered[p] & bits) == 0, "two shapes cover one sample of pixel ({}, {})", y, x);
                covered[p] |= bits;
                const int hits = std::popcount(bits);
                for (int c = 0; c < 3; ++c) color_sum[p * 3 + c] += static_cast<uint16_t>(hits * rgb[c]);
            }
        }
    }
    ShapesImage img{height, width, std::vector<uint8_t>(pixels * 3)};
    for (int y = 0; y < height; ++y) {
        for (int x = 0; x < width; ++x) {
            const int noise_x = scene.noise_mirrored ? width - 1 - x : x;
            const auto words = core::philox4x32(
                scene.noise_key, kNoiseStream, static_cast<uint64_t>(y) * static_cast<uint64_t>(width) + noise_x);
            const size_t p = static_cast<size_t>(y) * width + x;
            const int empty = 4 - std::popcount(covered[p]);
            for (int c = 0; c < 3; ++c) {
                // Multiply-shift onto 17 levels: each level gets floor or ceil of 2^32/17 words (bias < 4e-9).
                const int noise = static_cast<int>((uint64_t{words[c]} * kNoiseLevels) >> 32) - kNoiseLevels / 2;
                const int value = (empty * (kBackground + noise) + color_sum[p * 3 + c] + 2) / 4;
                img.rgb[p * 3 + c] = static_cast<uint8_t>(value);
            }
        }
    }
    return img;
}

ShapesImage shapes_render(const ShapesScene& scene) {
    return shapes_render(scene, scene.height, scene.width);
}

ShapesImage shapes_flip_image(const ShapesImage& image) {
    MT_CHECK(image.rgb.size() == static_cast<size_t>(image.height) * image.width * 3,
             "image {}x{} holds {} bytes, expected H*W*3",
             image.height,
             image.width,
             image.rgb.size());
    ShapesImage out = image;
    for (int y = 0; y < image.height; ++y)
        for (int x = 0; x < image.width; ++x)
            for (int c = 0; c < 3; ++c)
                out.rgb[(static_cast<size_t>(y) * image.width + x) * 3 + c] =
                    image.rgb[(static_cast<size_t>(y) * image.width + (image.width - 1 - x)) * 3 + c];
    return out;
}

}  // namespace mt::data
