// The CUDA gathers of array_select.cuh: gather_elements and gather_nd, one thread per output
// element (grid-stride), instantiated per element size.
#include "array_select.cuh"
#include "elementwise_device.cuh"

namespace loom::cuda::kernels {
namespace {

using namespace dev;

// The index wrapped into [0, n), or -1 when it lies outside [-n, n).
__device__ __forceinline__ std::int64_t wrapped(std::int64_t v, std::int64_t n) {
  if (v < 0) v += n;
  return v >= 0 && v < n ? v : -1;
}

template <class B, class Ix>
__global__ void gather_elements_kernel(const B* __restrict__ data, const Ix* __restrict__ idx,
                                       B* __restrict__ out, elements_layout l) {
  for (std::int64_t u = first_item(); u < l.count; u += grid_step()) {
    std::int64_t rest = u;
    std::int64_t at = 0;
    for (int d = l.rank - 1; d >= 0; --d) {
      const std::int64_t i = rest % l.dims[d];
      rest /= l.dims[d];
      if (d != l.axis) at += i * l.data_strides[d];
    }
    const std::int64_t v = wrapped(static_cast<std::int64_t>(idx[u]), l.n);
    out[u] = v < 0 ? B{0} : data[at + v * l.data_strides[l.axis]];
  }
}

template <class B, class Ix>
__global__ void gather_nd_kernel(const B* __restrict__ data, const Ix* __restrict__ idx,
                                 B* __restrict__ out, nd_layout l) {
  for (std::int64_t u = first_item(); u < l.count; u += grid_step()) {
    const std::int64_t t = u / l.slice;
    const std::int64_t e = u % l.slice;
    std::int64_t at = (t / l.tuples) * l.batch_stride + e;
    bool inside = true;
    for (int k = 0; k < l.q; ++k) {
      const std::int64_t v = wrapped(static_cast<std::int64_t>(idx[t * l.q + k]), l.dims[k]);
      inside = inside && v >= 0;
      at += v * l.dim_strides[k];
    }
    out[u] = inside ? data[at] : B{0};
  }
}

bool movable(std::size_t elem_bytes) {
  return elem_bytes == 1 || elem_bytes == 2 || elem_bytes == 4 || elem_bytes == 8;
}

// Calls f(B{}, Ix{}) with B the unsigned integer of `elem_bytes` bytes and Ix the index type.
template <class F>
void visit_select(std::size_t elem_bytes, bool index64, F&& f) {
  const auto with_index = [&](auto btag) {
    if (index64) {
      f(btag, std::int64_t{});
    } else {
      f(btag, std::int32_t{});
    }
  };
  switch (elem_bytes) {
    case 1:
      with_index(std::uint8_t{});
      break;
    case 2:
      with_index(std::uint16_t{});
      break;
    case 4:
      with_index(std::uint32_t{});
      break;
    default:
      with_index(std::uint64_t{});
      break;
  }
}

}  // namespace

bool launch_gather_elements(std::size_t elem_bytes, bool index64, const void* data,
                            const void* indices, void* out, const elements_layout& layout,
                            cudaStream_t stream) {
  if (!movable(elem_bytes) || layout.rank > select_max_dims) return false;
  if (layout.count <= 0) return true;
  visit_select(elem_bytes, index64, [&](auto btag, auto itag) {
    using B = decltype(btag);
    using Ix = decltype(itag);
    gather_elements_kernel<B, Ix><<<grid_for(layout.count), block_threads, 0, stream>>>(
        static_cast<const B*>(data), static_cast<const Ix*>(indices), static_cast<B*>(out), layout);
  });
  return true;
}

bool launch_gather_nd(std::size_t elem_bytes, bool index64, const void* data, const void* indices,
                      void* out, const nd_layout& layout, cudaStream_t stream) {
  if (!movable(elem_bytes) || layout.q > select_max_dims) return false;
  if (layout.count <= 0) return true;
  visit_select(elem_bytes, index64, [&](auto btag, auto itag) {
    using B = decltype(btag);
    using Ix = decltype(itag);
    gather_nd_kernel<B, Ix><<<grid_for(layout.count), block_threads, 0, stream>>>(
        static_cast<const B*>(data), static_cast<const Ix*>(indices), static_cast<B*>(out), layout);
  });
  return true;
}

}  // namespace loom::cuda::kernels
