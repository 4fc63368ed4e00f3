// Tensor: a strided view (shape, strides in elements, byte offset) over shared Storage, with a dtype and device.
// Copying a Tensor copies the view, not the data; views of one storage alias each other.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/dtype.h"
#include "core/error.h"

namespace mt::core {

using Shape = std::vector<int64_t>;

int64_t shape_numel(const Shape& shape);
std::string shape_str(const Shape& shape);  // "[2, 3, 4]"

class Tensor {
   public:
    Tensor() = default;

    // New zero-filled contiguous tensor.
    static Tensor zeros(const Shape& shape, DType dtype, Device device = Device::cpu);
    // New contiguous tensor whose contents are undefined: for scratch an op overwrites in full before reading it
    // (saves the zeroing memset on the GPU; Backend::set_scratch_poison fills it with NaN to catch a missed write).
    static Tensor scratch(const Shape& shape, DType dtype, Device device);
    // New zero-filled contiguous host tensor in pinned memory (Backend::alloc_pinned): the host side of copies that
    // overlap other work.
    static Tensor zeros_pinned(const Shape& shape, DType dtype);
    // Contiguous view over memory owned elsewhere (an arena, an mmap); the caller keeps it alive.
    static Tensor borrow(void* data, const Shape& shape, DType dtype, Device device = Device::cpu);
    // Contiguous view over a byte range of an existing storage (arenas hand out named views this way).
    static Tensor view_of(const std::shared_ptr<Storage>& storage, size_t byte_offset, const Shape& shape, DType dtype);

    bool defined() const {
        return storage_ != nullptr;
    }
    int ndim() const {
        return static_cast<int>(shape_.size());
    }
    const Shape& shape() const {
        return shape_;
    }
    const Shape& strides() const {
        return strides_;
    }
    int64_t size(int dim) const;
    int64_t stride(int dim) const;
    int64_t numel() const {
        return shape_numel(shape_);
    }
    size_t nbytes() const {
        return static_cast<size_t>(numel()) * dtype_size(dtype_);
    }
    DType dtype() const {
        return dtype_;
    }
    Device device() const {
        return storage_ ? storage_->device() : Device::cpu;
    }
    bool is_contiguous() const;
    const std::shared_ptr<Storage>& storage() const {
        return storage_;
    }

    void* raw() const;
    template <typename T>
    T* data() const {
        MT_CHECK(dtype_ == DTypeOf<T>::value,
                 "tensor holds {}, accessed as {}",
                 dtype_name(dtype_),
                 dtype_name(DTypeOf<T>::value));
        return static_cast<T*>(raw());
    }

    // Views (share storage). reshape needs a contiguous tensor.
    Tensor reshape(const Shape& shape) const;
    Tensor slice(int dim, int64_t start, int64_t end) const;  // [start, end) along dim
    Tensor select(int dim, int64_t index) const;              // drops dim
    Tensor flatten_to_2d() const;                             // [prod(shape[:-1]), shape[-1]]

    // Data operations. On the CPU fill/copy_from work on any strides and copy_from converts dtypes; with a device
    // tensor on either side they go through the device's backend (strided or converting copies via the host).
    void fill(double value) const;
    void zero() const {
        fill(0.0);
    }
    void copy_from(const Tensor& src) const;
    Tensor clone() const;
    Tensor to(DType dtype) const;           // new contiguous tensor converted to dtype, same device
    Tensor to_device(Device device) const;  // new contiguous tensor on device, same dtype
    // This tensor's elements on the host, same dtype and strides (a device view's strided bytes copied once; a host
    // tensor itself; a contiguous device one as to_device).
    Tensor on_host() const;
    double item() const;  // value of a one-element tensor as double
    double at(const std::vector<int64_t>& index) const;

   private:
    std::shared_ptr<Storage> storage_;
    size_t offset_ = 0;  // bytes
    Shape shape_;
    Shape strides_;
    DType dtype_ = DType::f32;
};

// Row-major strides for a shape.
Shape contiguous_strides(const Shape& shape);

// Reads element i (row-major logical order) of any float/int tensor as double; writes likewise.
double tensor_get_flat(const Tensor& t, int64_t i);
void tensor_set_flat(const Tensor& t, int64_t i, double value);

}  // namespace mt::core
