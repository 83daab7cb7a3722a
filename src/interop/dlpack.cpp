#include "loom/interop/dlpack.hpp"

#include <fmt/format.h>

#include <bit>
#include <cstddef>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <string>

#include "loom/core/dlpack_device.hpp"
#include "loom/core/error.hpp"
#include "loom/cuda/interop.hpp"
#include "loom/memory/loans.hpp"

namespace loom::interop {
namespace {

// ---- types ----------------------------------------------------------------------------

std::string describe(DLDataType t) {
  const char* kind = nullptr;
  switch (t.code) {
    case kDLInt:
      kind = "int";
      break;
    case kDLUInt:
      kind = "uint";
      break;
    case kDLFloat:
      kind = "float";
      break;
    case kDLBfloat:
      kind = "bfloat";
      break;
    case kDLComplex:
      kind = "complex";
      break;
    case kDLOpaqueHandle:
      kind = "opaque handle";
      break;
    case dl_bool_code:
      kind = "bool";
      break;
    default:
      return fmt::format("type code {} of {} bits x {} lanes", t.code, t.bits, t.lanes);
  }
  std::string out = fmt::format("{}{}", kind, t.bits);
  if (t.lanes != 1) out += fmt::format(" x {} lanes", t.lanes);
  return out;
}

// ---- export ---------------------------------------------------------------------------

// One allocation per export: the managed struct the consumer sees, and what keeps the
// memory alive until its deleter runs. The shapes live here (not moved afterwards), so
// dl_tensor.shape and .strides can point into them.
template <class Managed>
struct export_holder {
  Managed managed{};
  tensor t;  // holds a reference to the buffer
  shape dims;
  shape strides;
  std::uint64_t loan = 0;
};

template <class Managed>
void delete_export(Managed* self) noexcept {
  auto* h = static_cast<export_holder<Managed>*>(self->manager_ctx);
  memory::give_back(h->loan);
  delete h;  // drops the buffer reference
}

template <class Managed>
Managed* make_export(const tensor& t, const char* borrower) {
  auto h = std::make_unique<export_holder<Managed>>();
  h->t = t;
  h->dims = t.shape();
  h->strides = t.strides();
  DLTensor& d = h->managed.dl_tensor;
  // data points at element 0 and byte_offset is 0: consumers that ignore byte_offset (as
  // PyTorch 1.x does) read the right elements.
  d.data = t.defined() ? const_cast<void*>(static_cast<const void*>(t.raw_data())) : nullptr;
  d.byte_offset = 0;
  d.device = to_dlpack(t.defined() ? t.device() : device_id{device_type::cpu, 0});
  d.ndim = static_cast<std::int32_t>(h->dims.rank());
  d.dtype = to_dl_data_type(t.type());
  d.shape = h->dims.data();
  d.strides = h->strides.data();
  h->managed.manager_ctx = h.get();
  h->managed.deleter = &delete_export<Managed>;
  const std::size_t bytes = t.defined() ? t.num_elements() == 0 ? 0 : t.buf()->bytes() : 0;
  h->loan = memory::lend(t.defined() ? t.buf()->data() : nullptr, bytes, borrower);
  return &h.release()->managed;
}

// ---- import ---------------------------------------------------------------------------

// The product or sum of two int64s, or nothing when it overflows.
bool mul_overflows(std::int64_t a, std::int64_t b, std::int64_t& out) {
  return __builtin_mul_overflow(a, b, &out);
}
bool add_overflows(std::int64_t a, std::int64_t b, std::int64_t& out) {
  return __builtin_add_overflow(a, b, &out);
}

// Calls the producer's deleter when the last loom reference to the memory goes.
template <class Managed>
void release_import(void* context, void*, std::size_t, std::size_t, stream) noexcept {
  auto* m = static_cast<Managed*>(context);
  if (m->deleter != nullptr) m->deleter(m);
}

// The device of an import: the CPU and CUDA's three kinds of memory (Note [cuda imports]).
device_id import_device(const DLDevice& d, const char* what) {
  // Read as the integer it is: a producer may write any code, and loading a value outside
  // DLDeviceType's enumerators as the enum is undefined behaviour (UBSan reports it).
  static_assert(sizeof(d.device_type) == sizeof(std::int32_t));
  std::int32_t code = 0;
  std::memcpy(&code, &d.device_type, sizeof code);
  const bool known =
      code == kDLCPU || code == kDLCUDA || code == kDLCUDAHost || code == kDLCUDAManaged;
  if (!is_valid_device_type(code)) {
    throw invalid_argument(
        fmt::format("{}: DLPack device type {} is no DLPack device type", what, code));
  }
  if (!known) {
    throw unsupported_error(fmt::format(
        "{}: the tensor is on DLPack device ({}, {}), {}; loom imports CPU (1), CUDA (2), "
        "CUDA host (3) and CUDA managed (13) memory (copy it to one of those first)",
        what, code, d.device_id, to_string(static_cast<device_type>(code))));
  }
  if (d.device_id < 0) {
    throw invalid_argument(fmt::format("{}: negative device id {}", what, d.device_id));
  }
  // Pinned host memory is one pool for every GPU: loom names it cuda_host:0.
  if (code == kDLCUDAHost) return {device_type::cuda_host, 0};
  return loom::from_dlpack(d);
}

template <class Managed>
tensor import(Managed* m, bool read_only, stream on, const char* what) {
  if (m == nullptr) throw invalid_argument(fmt::format("{}: null managed tensor", what));
  const DLTensor& d = m->dl_tensor;
  const dtype t = dtype_from_dl(d.dtype);
  const device_id dev = import_device(d.device, what);
  if (d.ndim < 0) throw invalid_argument(fmt::format("{}: negative ndim {}", what, d.ndim));
  if (d.ndim > max_import_rank) {
    // Refused before reading d.shape: a wild ndim would read far past the producer's array.
    throw invalid_argument(fmt::format("{}: ndim {} (loom imports at most {} dimensions)", what,
                                       d.ndim, max_import_rank));
  }
  const auto rank = static_cast<std::size_t>(d.ndim);
  if (rank > 0 && d.shape == nullptr) {
    throw invalid_argument(fmt::format("{}: ndim {} with a null shape", what, d.ndim));
  }
  shape dims = shape::filled(rank, 0);
  shape strides = shape::filled(rank, 0);
  std::int64_t count = 1;
  for (std::size_t i = 0; i < rank; ++i) {
    if (d.shape[i] < 0) {
      throw invalid_argument(fmt::format("{}: dimension {} is {}", what, i, d.shape[i]));
    }
    dims[i] = d.shape[i];
    if (mul_overflows(count, d.shape[i], count)) {
      throw invalid_argument(fmt::format("{}: the shape's element count overflows", what));
    }
  }
  // Row-major strides when none are given; the element range [lo, hi] the view touches.
  std::int64_t lo = 0;
  std::int64_t hi = 0;
  std::int64_t next = 1;
  for (std::size_t i = rank; i-- > 0;) {
    const std::int64_t s = d.strides != nullptr ? d.strides[i] : next;
    strides[i] = s;
    if (d.strides == nullptr) next *= std::max<std::int64_t>(dims[i], 1);
    if (dims[i] == 0) continue;
    std::int64_t span = 0;
    std::int64_t& end = s < 0 ? lo : hi;
    if (mul_overflows(dims[i] - 1, s, span) || add_overflows(end, span, end)) {
      throw invalid_argument(
          fmt::format("{}: stride {} of dimension {} (size {}) reaches past the 64-bit range", what,
                      s, i, dims[i]));
    }
  }
  const auto esize = static_cast<std::int64_t>(size_of(t));
  std::int64_t extent = 0;  // bytes the view spans: (hi - lo + 1) elements
  std::int64_t elements = 0;
  if (count != 0 &&
      (__builtin_sub_overflow(hi, lo, &elements) || add_overflows(elements, 1, elements) ||
       mul_overflows(elements, esize, extent))) {
    throw invalid_argument(
        fmt::format("{}: the strides span more bytes than fit in 64 bits", what));
  }
  if (count != 0 && d.data == nullptr) {
    throw invalid_argument(fmt::format("{}: null data for {} elements", what, count));
  }
  // The bytes the view touches, [first, first + extent), must be addresses: data +
  // byte_offset and the reach of negative strides may not wrap around the address space.
  // Elements are read in place, so the first one (and with it every other) must be aligned
  // to its size. Without elements nothing is read, and the producer's pointer is kept.
  std::byte* start = static_cast<std::byte*>(d.data);
  if (count != 0) {
    const auto data = reinterpret_cast<std::uintptr_t>(d.data);
    const auto back = static_cast<std::uintptr_t>(-lo) * static_cast<std::uintptr_t>(esize);
    std::uintptr_t element0 = 0;  // data + byte_offset
    std::uintptr_t first = 0;     // the lowest byte touched
    std::uintptr_t last = 0;      // one past the highest
    if (__builtin_add_overflow(data, d.byte_offset, &element0) ||
        __builtin_sub_overflow(element0, back, &first) ||
        __builtin_add_overflow(first, static_cast<std::uintptr_t>(extent), &last)) {
      throw invalid_argument(fmt::format(
          "{}: data 0x{:x} + byte_offset {}, with strides reaching {} elements back and {} "
          "forward, wraps around the address space",
          what, data, d.byte_offset, -lo, hi));
    }
    if (first % static_cast<std::uintptr_t>(esize) != 0) {
      throw invalid_argument(fmt::format(
          "{}: data 0x{:x} + byte_offset {} is not aligned to the {}-byte elements ({}); loom "
          "reads elements in place and takes aligned data only",
          what, data, d.byte_offset, esize, describe(d.dtype)));
    }
    start = reinterpret_cast<std::byte*>(first);
  }
  const auto address = reinterpret_cast<std::uintptr_t>(start);
  const std::size_t alignment =
      address == 0 ? 256 : std::min<std::size_t>(std::size_t{1} << std::countr_zero(address), 256);
  // Nothing below throws but for memory: adopt takes `m` only after every check passed.
  buffer_ptr buf = buffer::adopt(start, static_cast<std::size_t>(extent), alignment, dev,
                                 dev.type == device_type::cpu ? stream{} : on,
                                 &release_import<Managed>, m, read_only);
  return tensor::strided(std::move(buf), t, std::move(dims), std::move(strides),
                         count == 0 ? 0 : -lo);
}

}  // namespace

DLDataType to_dl_data_type(dtype t) noexcept {
  DLDataType out{};
  out.lanes = 1;
  out.bits = static_cast<std::uint8_t>(8 * size_of(t));
  switch (t) {
    case dtype::f32:
    case dtype::f64:
    case dtype::f16:
      out.code = kDLFloat;
      break;
    case dtype::bf16:
      out.code = kDLBfloat;
      break;
    case dtype::i32:
    case dtype::i64:
    case dtype::i8:
      out.code = kDLInt;
      break;
    case dtype::u8:
      out.code = kDLUInt;
      break;
    case dtype::boolean:
      out.code = dl_bool_code;
      break;
  }
  return out;
}

dtype dtype_from_dl(DLDataType t) {
  if (t.lanes == 1) {
    switch (t.code) {
      case kDLFloat:
        if (t.bits == 16) return dtype::f16;
        if (t.bits == 32) return dtype::f32;
        if (t.bits == 64) return dtype::f64;
        break;
      case kDLBfloat:
        if (t.bits == 16) return dtype::bf16;
        break;
      case kDLInt:
        if (t.bits == 8) return dtype::i8;
        if (t.bits == 32) return dtype::i32;
        if (t.bits == 64) return dtype::i64;
        break;
      case kDLUInt:
        if (t.bits == 8) return dtype::u8;
        break;
      case dl_bool_code:
        if (t.bits == 8) return dtype::boolean;
        break;
      default:
        break;
    }
  }
  throw unsupported_error(fmt::format(
      "DLPack dtype {} has no loom dtype (loom has float16/32/64, bfloat16, int8/32/64, "
      "uint8 and bool)",
      describe(t)));
}

DLManagedTensor* to_dlpack(const tensor& t) {
  return make_export<DLManagedTensor>(t, "DLPack (dltensor)");
}

DLManagedTensorVersioned* to_dlpack_versioned(const tensor& t, std::uint64_t flags) {
  DLManagedTensorVersioned* m = make_export<DLManagedTensorVersioned>(t, "DLPack 1.0");
  m->version = DLPackVersion{dlpack_major_version, dlpack_minor_version};
  m->flags = flags;
  if (t.defined() && t.buf()->read_only()) m->flags |= DLPACK_FLAG_BITMASK_READ_ONLY;
  return m;
}

tensor from_dlpack(DLManagedTensor* m, stream s) {
  return import(m, false, s, "from_dlpack");
}

tensor from_dlpack(DLManagedTensorVersioned* m, stream s) {
  if (m != nullptr && m->version.major != dlpack_major_version) {
    throw unsupported_error(
        fmt::format("from_dlpack: DLPack version {}.{}; loom reads major version {}",
                    m->version.major, m->version.minor, dlpack_major_version));
  }
  return import(m, m != nullptr && (m->flags & DLPACK_FLAG_BITMASK_READ_ONLY) != 0, s,
                "from_dlpack");
}

std::optional<stream> consumer_stream_for(const tensor& t,
                                          std::optional<std::int64_t> stream_number) {
  const device_id dev = t.defined() ? t.device() : device_id{device_type::cpu, 0};
  const bool has_streams = dev.type == device_type::cuda || dev.type == device_type::cuda_managed;
  if (!has_streams) {
    if (stream_number && *stream_number != no_sync_stream) {
      throw invalid_argument(fmt::format(
          "DLPack stream {}: the tensor is in {} memory, which has no streams (stream must be "
          "None or -1)",
          *stream_number, to_string(dev)));
    }
    return std::nullopt;
  }
  // The Python array API: None means the legacy default stream on CUDA.
  const std::int64_t n = stream_number.value_or(legacy_default_stream);
  if (n == no_sync_stream) return std::nullopt;
  if (n == 0) {
    throw invalid_argument(
        "DLPack stream 0 is disallowed on CUDA: it is ambiguous (None, 1 for the legacy "
        "default stream, or 2 for the per-thread default stream)");
  }
  if (n < no_sync_stream) {
    throw invalid_argument(
        fmt::format("DLPack stream {} is no stream (-1, 1, 2 or a cudaStream_t as an integer)", n));
  }
  return stream_from_protocol(n);
}

void prepare_export(const tensor& t, std::optional<std::int64_t> consumer_stream) {
  const std::optional<stream> consumer = consumer_stream_for(t, consumer_stream);
  if (!consumer) return;
  cuda_stream_wait(t.device().index, *consumer, t.buf()->stream_of());
}

}  // namespace loom::interop
