// Tensor views and the few CPU data operations every layer needs (fill, strided copy with conversion).
#include "core/tensor.h"

#include <cstring>

#include "core/backend.h"

namespace mt::core {

int64_t shape_numel(const Shape& shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
}

std::string shape_str(const Shape& shape) {
    std::string s = "[";
    for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
}

Shape contiguous_strides(const Shape& shape) {
    Shape strides(shape.size());
    int64_t s = 1;
    for (int i = static_cast<int>(shape.size()) - 1; i >= 0; --i) {
        strides[i] = s;
        s *= shape[i];
    }
    return strides;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
    for (int64_t d : shape) MT_CHECK(d >= 0, "negative dimension in shape {}", shape_str(shape));
    Tensor t;
    t.storage_ = std::make_shared<Storage>(static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype), device);
    t.shape_ = shape;
    t.strides_ = contiguous_strides(shape);
    t.dtype_ = dtype;
    return t;
}

Tensor Tensor::scratch(const Shape& shape, DType dtype, Device device) {
    for (int64_t d : shape) MT_CHECK(d >= 0, "negative dimension in shape {}", shape_str(shape));
    const size_t bytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
    return view_of(std::make_shared<Storage>(bytes, device, Storage::Uninitialized{}), 0, shape, dtype);
}

Tensor Tensor::zeros_pinned(const Shape& shape, DType dtype) {
    for (int64_t d : shape) MT_CHECK(d >= 0, "negative dimension in shape {}", shape_str(shape));
    const size_t bytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
    return view_of(std::make_shared<Storage>(bytes, Storage::Pinned{}), 0, shape, dtype);
}

Tensor Tensor::borrow(void* data, const Shape& shape, DType dtype, Device device) {
    const size_t bytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
    return view_of(std::make_shared<Storage>(data, bytes, device), 0, shape, dtype);
}

Tensor Tensor::view_of(const std::shared_ptr<Storage>& storage, size_t byte_offset, const Shape& shape, DType dtype) {
    const size_t bytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
    MT_CHECK(byte_offset + bytes <= storage->bytes(),
             "view of {} bytes at {} exceeds storage of {} bytes",
             bytes,
             byte_offset,
             storage->bytes());
    Tensor t;
    t.storage_ = storage;
    t.offset_ = byte_offset;
    t.shape_ = shape;
    t.strides_ = contiguous_strides(shape);
    t.dtype_ = dtype;
    return t;
}

int64_t Tensor::size(int dim) const {
    if (dim < 0) dim += ndim();
    MT_CHECK(dim >= 0 && dim < ndim(), "dim {} out of range for shape {}", dim, shape_str(shape_));
    return shape_[dim];
}

int64_t Tensor::stride(int dim) const {
    if (dim < 0) dim += ndim();
    MT_CHECK(dim >= 0 && dim < ndim(), "dim {} out of range for shape {}", dim, shape_str(shape_));
    return strides_[dim];
}

bool Tensor::is_contiguous() const {
    return strides_ == contiguous_strides(shape_) || numel() <= 1;
}

void* Tensor::raw() const {
    MT_CHECK(storage_ != nullptr, "access to an undefined tensor");
    return static_cast<char*>(storage_->data()) + offset_;
}

Tensor Tensor::reshape(const Shape& shape) const {
    MT_CHECK(is_contiguous(), "reshape of a non-contiguous tensor {}", shape_str(shape_));
    MT_CHECK(shape_numel(shape) == numel(),
             "reshape {} -> {} changes the element count",
             shape_str(shape_),
             shape_str(shape));
    Tensor t = *this;
    t.shape_ = shape;
    t.strides_ = contiguous_strides(shape);
    return t;
}

Tensor Tensor::slice(int dim, int64_t start, int64_t end) const {
    if (dim < 0) dim += ndim();
    MT_CHECK(dim >= 0 && dim < ndim(), "slice dim {} out of range for {}", dim, shape_str(shape_));
    MT_CHECK(0 <= start && start <= end && end <= shape_[dim],
             "slice [{}, {}) out of range for dim {} of {}",
             start,
             end,
             dim,
             shape_str(shape_));
    Tensor t = *this;
    t.offset_ += static_cast<size_t>(start * strides_[dim]) * dtype_size(dtype_);
    t.shape_[dim] = end - start;
    return t;
}

Tensor Tensor::select(int dim, int64_t index) const {
    if (dim < 0) dim += ndim();
    Tensor t = slice(dim, index, index + 1);
    t.shape_.erase(t.shape_.begin() + dim);
    t.strides_.erase(t.strides_.begin() + dim);
    return t;
}

Tensor Tensor::flatten_to_2d() const {
    MT_CHECK(ndim() >= 1, "flatten of a scalar tensor");
    const int64_t last = shape_.back();
    return reshape({last == 0 ? 0 : numel() / last, last});
}

namespace {
// Calls fn(element offset) for every element in row-major logical order.
template <typename Fn>
void for_each_offset(const Shape& shape, const Shape& strides, Fn&& fn) {
    const int64_t n = shape_numel(shape);
    if (n == 0) return;
    std::vector<int64_t> index(shape.size(), 0);
    int64_t offset = 0;
    for (int64_t i = 0; i < n; ++i) {
        fn(i, offset);
        for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
            if (++index[d] < shape[d]) {
                offset += strides[d];
                break;
            }
            offset -= strides[d] * (shape[d] - 1);
            index[d] = 0;
        }
    }
}

double load(const void* base, DType dtype, int64_t offset) {
    switch (dtype) {
        case DType::f32:
            return static_cast<const float*>(base)[offset];
        case DType::f64:
            return static_cast<const double*>(base)[offset];
        case DType::bf16:
            return bf16_to_f32(static_cast<const uint16_t*>(base)[offset]);
        case DType::f16:
            return f16_to_f32(static_cast<const uint16_t*>(base)[offset]);
        case DType::i32:
            return static_cast<const int32_t*>(base)[offset];
        case DType::i64:
            return static_cast<double>(static_cast<const int64_t*>(base)[offset]);
        case DType::u16:
            return static_cast<const uint16_t*>(base)[offset];
        case DType::u8:
            return static_cast<const uint8_t*>(base)[offset];
    }
    return 0.0;
}

void store(void* base, DType dtype, int64_t offset, double v) {
    switch (dtype) {
        case DType::f32:
            static_cast<float*>(base)[offset] = static_cast<float>(v);
            break;
        case DType::f64:
            static_cast<double*>(base)[offset] = v;
            break;
        case DType::bf16:
            static_cast<uint16_t*>(base)[offset] = f32_to_bf16(static_cast<float>(v));
            break;
        case DType::f16:
            static_cast<uint16_t*>(base)[offset] = f32_to_f16(static_cast<float>(v));
            break;
        case DType::i32:
            static_cast<int32_t*>(base)[offset] = static_cast<int32_t>(v);
            break;
        case DType::i64:
            static_cast<int64_t*>(base)[offset] = static_cast<int64_t>(v);
            break;
        case DType::u16:
            static_cast<uint16_t*>(base)[offset] = static_cast<uint16_t>(v);
            break;
        case DType::u8:
            static_cast<uint8_t*>(base)[offset] = static_cast<uint8_t>(v);
            break;
    }
}
}  // namespace

void Tensor::fill(double value) const {
    if (device() != Device::cpu) {
        MT_CHECK(is_contiguous(), "fill of a non-contiguous {} tensor", device_name(device()));
        if (value == 0.0) return backend_get(device()).memset_zero(raw(), nbytes());
        Tensor host = zeros(shape_, dtype_);
        host.fill(value);
        return copy_from(host);
    }
    void* base = raw();
    if (is_contiguous() && value == 0.0) {
        std::memset(base, 0, nbytes());
        return;
    }
    for_each_offset(shape_, strides_, [&](int64_t, int64_t off) { store(base, dtype_, off, value); });
}

void Tensor::copy_from(const Tensor& src) const {
    MT_CHECK(src.shape_ == shape_, "copy of {} into {}", shape_str(src.shape_), shape_str(shape_));
    if (device() != Device::cpu || src.device() != Device::cpu) {
        // Device copies move raw bytes; a dtype change or strides are handled on the host.
        if (src.dtype_ == dtype_ && is_contiguous() && src.is_contiguous()) {
            const Device d = device() != Device::cpu ? device() : src.device();
            return backend_get(d).copy(raw(), device(), src.raw(), src.device(), nbytes());
        }
        const Tensor host_src = src.device() == Device::cpu ? src : src.on_host();
        if (device() == Device::cpu) return copy_from(host_src);
        MT_CHECK(is_contiguous(), "copy into a non-contiguous {} tensor", device_name(device()));
        return copy_from(host_src.to(dtype_));
    }
    if (src.dtype_ == dtype_ && is_contiguous() && src.is_contiguous()) {
        std::memmove(raw(), src.raw(), nbytes());
        return;
    }
    if (is_contiguous() && src.is_contiguous() && raw() != src.raw()) {
        // A dtype conversion of whole buffers (master weights -> the bf16 copy at init and resume: billions of
        // elements): element-wise and independent, so split across threads.
        const void* sbase = src.raw();
        void* dbase = raw();
        const int64_t n = numel();
        const DType sd = src.dtype_, dd = dtype_;
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < n; ++i) store(dbase, dd, i, load(sbase, sd, i));
        return;
    }
    std::vector<int64_t> src_offsets;
    src_offsets.reserve(static_cast<size_t>(numel()));
    for_each_offset(src.shape_, src.strides_, [&](int64_t, int64_t off) { src_offsets.push_back(off); });
    const void* sbase = src.raw();
    void* dbase = raw();
    for_each_offset(shape_, strides_, [&](int64_t i, int64_t off) {
        store(dbase, dtype_, off, load(sbase, src.dtype_, src_offsets[static_cast<size_t>(i)]));
    });
}

Tensor Tensor::on_host() const {
    if (device() == Device::cpu) return *this;
    if (is_contiguous()) return to_device(Device::cpu);
    // A strided view of device memory: the bytes from its first element to its last, copied once, under the same
    // strides (a to_device would come back here through copy_from).
    int64_t span = numel() > 0 ? 1 : 0;
    for (size_t d = 0; d < shape_.size() && span > 0; ++d) {
        MT_CHECK(strides_[d] >= 0, "a device view with a negative stride");
        span += (shape_[d] - 1) * strides_[d];
    }
    Tensor host = zeros({span}, dtype_, Device::cpu);
    if (span > 0)
        backend_get(device()).copy(
            host.raw(), Device::cpu, raw(), device(), static_cast<size_t>(span) * dtype_size(dtype_));
    host.shape_ = shape_;
    host.strides_ = strides_;
    return host;
}

Tensor Tensor::to_device(Device device) const {
    Tensor t = zeros(shape_, dtype_, device);
    t.copy_from(*this);
    return t;
}

Tensor Tensor::clone() const {
    Tensor t = zeros(shape_, dtype_, device());
    t.copy_from(*this);
    return t;
}

Tensor Tensor::to(DType dtype) const {
    if (device() != Device::cpu) return to_device(Device::cpu).to(dtype).to_device(device());
    Tensor t = zeros(shape_, dtype, device());
    t.copy_from(*this);
    return t;
}

double Tensor::item() const {
    MT_CHECK(numel() == 1, "item() of a tensor with {} elements", numel());
    if (device() != Device::cpu) return to_device(Device::cpu).item();
    return load(raw(), dtype_, 0);
}

double Tensor::at(const std::vector<int64_t>& index) const {
    MT_CHECK(static_cast<int>(index.size()) == ndim(), "index rank {} for tensor {}", index.size(), shape_str(shape_));
    MT_CHECK(
        device() == Device::cpu, "at() reads host memory; copy the {} tensor to the CPU first", device_name(device()));
    int64_t off = 0;
    for (size_t d = 0; d < index.size(); ++d) {
        MT_CHECK(index[d] >= 0 && index[d] < shape_[d], "index {} out of range in dim {}", index[d], d);
        off += index[d] * strides_[d];
    }
    return load(raw(), dtype_, off);
}

double tensor_get_flat(const Tensor& t, int64_t i) {
    MT_CHECK(t.device() == Device::cpu, "tensor_get_flat reads host memory");
    MT_CHECK(t.is_contiguous() && i >= 0 && i < t.numel(), "flat index {} for tensor of {} elements", i, t.numel());
    return load(t.raw(), t.dtype(), i);
}

void tensor_set_flat(const Tensor& t, int64_t i, double value) {
    MT_CHECK(t.device() == Device::cpu, "tensor_set_flat writes host memory");
    MT_CHECK(t.is_contiguous() && i >= 0 && i < t.numel(), "flat index {} for tensor of {} elements", i, t.numel());
    store(t.raw(), t.dtype(), i, value);
}

}  // namespace mt::core
