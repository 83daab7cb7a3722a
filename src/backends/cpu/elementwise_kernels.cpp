// CPU element-wise kernels: the family's table, and the helpers shared by its files
// (Note [element-wise iteration] in elementwise_loop.hpp).
#include "elementwise_kernels.hpp"

#include "cpu_kernels.hpp"
#include "elementwise_loop.hpp"

namespace loom::cpu {

namespace ew {

shape broadcast_shape_of(const kernel_context& ctx, std::initializer_list<const shape*> shapes) {
  shape out;
  for (const shape* s : shapes) {
    try {
      out = broadcast_shapes(out, *s);
    } catch (const invalid_argument& e) {
      ctx.fail("inputs do not broadcast: {}", e.what());
    }
  }
  return out;
}

tensor& forward_or_allocate(kernel_context& ctx, const shape& s,
                            std::initializer_list<std::size_t> candidates) {
  for (std::size_t i : candidates) {
    // The element-wise kernels need the same shape, not only the same element count.
    if (ctx.input(i).defined() && ctx.input(i).shape() == s) {
      if (tensor* out = ctx.forward_input(i, 0, s)) return *out;
    }
  }
  return ctx.allocate_output(0, s);
}

}  // namespace ew

void register_elementwise_kernels(kernel_registry& r) {
  register_unary_kernels(r);
  register_binary_kernels(r);
  register_cast_kernels(r);
  register_generator_kernels(r);
  register_fused_kernels(r);
}

}  // namespace loom::cpu
