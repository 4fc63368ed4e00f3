// Image preparation for the vision tower (multimodal.md §1): the target size inside [min_pixels, max_pixels] with
// both sides multiples of 28, a bilinear resize, and the cut into normalised 14x14 patches in the order the patch
// embedding reads them. Every source of images (the shapes generator, later real image-text data) goes through here,
// so the ViT always sees pixels prepared one way.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

namespace mt::data {

inline constexpr int kImagePatch = 14;     // vision.patch
inline constexpr int kImageMultiple = 28;  // two patches: the 2x2 pixel shuffle needs an even patch grid

struct ImageSize {
    int height = 0;
    int width = 0;
    bool operator==(const ImageSize&) const = default;
};

// The size an H x W image is resized to: aspect ratio kept, both sides multiples of `multiple`, area inside
// [min_pixels, max_pixels]. "Nearest" is defined in units of u = multiple:
//   1. s = 1 when H*W is inside the range, else sqrt(max_pixels / HW) (too large) or sqrt(min_pixels / HW) (too
//      small); the ideal sides are h* = s*H/u and w* = s*W/u.
//   2. a = max(1, round(h*)), b = max(1, round(w*)), halves rounding up.
//   3. While a*b*u^2 > max_pixels, take one unit off the side whose removal leaves a:b closer to H:W (error
//      max(aW, bH) / min(aW, bH), compared exactly; ties take it off the height; a side of 1 unit stays). While
//      a*b*u^2 < min_pixels, add one unit likewise, to a side whose growth stays within max_pixels.
// Step 3 moves one unit at a time, keeping the aspect ratio as well as a one-unit step can, so the result is the
// rounded ideal whenever that fits, and an extreme aspect ratio ends as a strip one unit thick. It fails only when a
// step up must cross the whole range, which needs max_pixels < 2 min_pixels (the defaults 112^2 and 448^2 are 16x
// apart).
// MT_CHECK: H, W, multiple >= 1 and some multiple-sided size fits the range.
// @param[in] height, width          the source image, pixels
// @param[in] min_pixels, max_pixels vision.min_pixels, vision.max_pixels
// @param[in] multiple               side granularity (28 = two 14-pixel patches)
ImageSize image_fit_size(int height, int width, int64_t min_pixels, int64_t max_pixels, int multiple = kImageMultiple);

// Bilinear resize of an RGB uint8 image, [H, W, 3] row-major to [H2, W2, 3], with half-pixel centres and no
// antialiasing: the formula of torch.nn.functional.interpolate(mode="bilinear", align_corners=False,
// antialias=False) on float input, then rounded half up and clamped to 0..255. Output pixel (y, x) samples source
// coordinate ((y + 0.5) H/H2 - 0.5, (x + 0.5) W/W2 - 0.5), clamped below at 0 and with the far neighbour clamped to
// the last row/column. Downscaling by more than 2x therefore skips pixels (no antialias); shapes images are rendered
// at their final size and never take that path. All math is double with a fixed evaluation order, so the result is
// the same on every IEEE platform; an unchanged size returns the input bytes exactly.
// @param[in] rgb            [height, width, 3] uint8
// @param[in] height, width  source size, >= 1
// @param[in] height2, width2 target size, >= 1
std::vector<uint8_t> image_resize_bilinear(const uint8_t* rgb, int height, int width, int height2, int width2);

// Patch cut and per-channel normalisation (x / 255 - mean[c]) / std[c] (vision defaults mean = std = 0.5, so values
// lie in [-1, 1]).
struct ImagePatchOptions {
    int patch = kImagePatch;
    std::array<float, 3> mean = {0.5f, 0.5f, 0.5f};
    std::array<float, 3> std = {0.5f, 0.5f, 0.5f};
};

// Values per flattened patch: patch * patch * 3 (588 at 14).
int64_t image_patch_values(int patch = kImagePatch);

// Cuts an image into the (H/p) x (W/p) patch grid in raster order (patch (i, j) is number i*(W/p) + j), each patch
// flattened in (row, column, channel) order, the layout the patch embedding's [d_v, 588] weight reads. MT_CHECK that
// H and W are positive multiples of 2p (the grid must be even for the 2x2 pixel shuffle) and std is nonzero.
// @param[in]  rgb            [height, width, 3] uint8
// @param[in]  height, width  multiples of 2 * options.patch
// @param[in]  options        patch size, mean and std
// @param[out] out            [(H/p)(W/p), p*p*3] float, written
void image_patchify(const uint8_t* rgb, int height, int width, const ImagePatchOptions& options, float* out);

}  // namespace mt::data
