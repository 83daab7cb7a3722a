// The kernels that are the same on every device, registered once for each device type:
// placeholder and _arg (fed, never computed), identity, no_op, _recv (a copy through the
// receiving device's own copy_from_host), and the pure views squeeze, expand_dims and
// broadcast_to (Note [array views] in src/kernel/common/array_views.hpp), which only
// change shape and strides and touch no data. Kernels that move data on a device keep a
// part per backend: reshape (of a non-contiguous input), transpose and the other array
// kernels are shared over each backend's copy (array_kernels.hpp); const, _send and the
// variable updates stay with each backend.
#pragma once

#include "loom/kernel/kernel_registry.hpp"
#include "loom/kernel/op_kernel.hpp"

namespace loom::common {

/// Output 0 is input 0, the same tensor: identity, and _send wherever sending needs no copy.
class identity_kernel final : public op_kernel {
 public:
  using op_kernel::op_kernel;
  void compute(kernel_context& ctx) override { ctx.set_output(0, ctx.input(0)); }
};

/// Registers the device-neutral kernels for cpu and for cuda, with each backend's label
/// ("reference" on cpu, "cuda" on cuda) and the default priority. Devices of a type that
/// is not built never exist, so a kernel registered for it is never placed.
void register_device_neutral_kernels(kernel_registry& registry);

}  // namespace loom::common
