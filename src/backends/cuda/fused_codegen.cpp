// fused_codegen: CUDA C++ source of a fused_elementwise expression (Note [fused cuda
// kernel] in fused_codegen.hpp).
#include "fused_codegen.hpp"

#include <fmt/format.h>

#include <bit>
#include <cmath>
#include <numbers>

#include "kernel/common/elementwise_rules.hpp"
#include "loom/core/error.hpp"
#include "loom/core/half.hpp"

namespace loom::cuda {
namespace {

bool is_identifier(const std::string& s) {
  if (s.empty() || (s[0] >= '0' && s[0] <= '9')) return false;
  for (char c : s) {
    const bool ok =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
    if (!ok) return false;
  }
  return true;
}

// A float constant as exact CUDA source: a hex float, or its bits where a literal would be
// out of range (infinities, which a double literal can round to, and subnormals) or would
// draw NVRTC's "division by zero" warning (zeros: div(%0, 0) is a valid expression).
std::string float_literal(float x) {
  if (std::isnormal(x)) return fmt::format("{:a}f", x);
  return fmt::format("__uint_as_float(0x{:08x}u)", std::bit_cast<std::uint32_t>(x));
}
std::string double_literal(double x) {
  if (std::isnormal(x)) return fmt::format("{:a}", x);
  return fmt::format("__longlong_as_double((long long)0x{:016x}ull)",
                     std::bit_cast<std::uint64_t>(x));
}

// ---- the prelude: helpers the ops and the 16-bit types need ---------------------------------

// float16 / bfloat16 <-> float: elementwise_half.hpp's conversions, bit for bit (round to
// nearest even, NaN stays NaN, subnormals exact).
constexpr const char* half_helpers =
    R"(__device__ __forceinline__ float loom_load(unsigned short h) {
  const unsigned int bits = h;
  const float magic = __uint_as_float((254u - 15u) << 23);
  const float scaled = __uint_as_float((bits & 0x7fffu) << 13) * magic;
  unsigned int o = __float_as_uint(scaled);
  if ((bits & 0x7c00u) == 0x7c00u) o |= 0x7f800000u;
  return __uint_as_float(o | ((bits & 0x8000u) << 16));
}
__device__ __forceinline__ unsigned short loom_store(float f) {
  const unsigned int u = __float_as_uint(f);
  const unsigned int sign = (u >> 16) & 0x8000u;
  const unsigned int a = u & 0x7fffffffu;
  const unsigned int denorm_magic = ((127u - 15u) + (23u - 10u) + 1u) << 23;
  const unsigned int sub =
      __float_as_uint(__uint_as_float(a) + __uint_as_float(denorm_magic)) - denorm_magic;
  const unsigned int normal = (a + 0xc8000fffu + ((a >> 13) & 1u)) >> 13;
  const unsigned int special = a > 0x7f800000u ? 0x7e00u : 0x7c00u;
  unsigned int o = a < 0x38800000u ? sub : normal;
  o = a >= 0x477ff000u ? special : o;
  return (unsigned short)(o | sign);
}
)";

constexpr const char* bf16_helpers =
    R"(__device__ __forceinline__ float loom_load(unsigned short h) {
  return __uint_as_float((unsigned int)h << 16);
}
__device__ __forceinline__ unsigned short loom_store(float f) {
  const unsigned int u = __float_as_uint(f);
  const unsigned int rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const unsigned int quiet_nan = (u >> 16) | 0x40u;
  return (unsigned short)((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}
)";

// float32 exp, tanh, sigmoid: elementwise_math.hpp's fast_exp / fast_tanh / fast_sigmoid,
// the same operations in the same order (compiled without FMA contraction).
constexpr const char* float_exp_helper = R"(__device__ __forceinline__ float loom_exp(float x) {
  float xc = x < -104.0f ? -104.0f : x;
  xc = xc > 89.0f ? 89.0f : xc;
  const float t = xc * 1.44269504088896341f + 12582912.0f;
  const float nf = t - 12582912.0f;
  const int n = __float_as_int(t) - 0x4b400000;
  const float r = (xc - nf * 0.693359375f) + nf * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  const int n1 = n >> 1;
  const int n2 = n - n1;
  const float s1 = __uint_as_float((unsigned int)(n1 + 127) << 23);
  const float s2 = __uint_as_float((unsigned int)(n2 + 127) << 23);
  return y * s1 * s2;
}
__device__ __forceinline__ float loom_sigmoid(float x) { return 1.0f / (1.0f + loom_exp(-x)); }
)";

constexpr const char* float_tanh_helper = R"(__device__ __forceinline__ float loom_tanh(float x) {
  const float ax = fabsf(x);
  const float z = x * x;
  float p = -5.70498872745e-3f;
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  const float small = p * z * x + x;
  const float big = 1.0f - 2.0f / (loom_exp(2.0f * ax) + 1.0f);
  return ax < 0.625f ? small : copysignf(big, x);
}
)";

// ---- one instruction -------------------------------------------------------------------------

// The expression of `op` over operands a and b (C++ source of the compute type), exactly
// as the CPU kernel's eval<Op, C> computes it.
std::string op_source(ew_op op, bool f32, const std::string& a, const std::string& b) {
  // Constants in the compute type, as the CPU kernel's C{...} and numbers::sqrt2_v<C>.
  auto c = [&](double v) { return f32 ? float_literal(static_cast<float>(v)) : double_literal(v); };
  const std::string one = f32 ? "1.0f" : "1.0";
  const char* sfx = f32 ? "f" : "";
  switch (op) {
    case ew_op::neg:
      return fmt::format("-{}", a);
    case ew_op::abs:
      return fmt::format("fabs{}({})", sfx, a);
    case ew_op::exp:
      return f32 ? fmt::format("loom_exp({})", a) : fmt::format("exp({})", a);
    case ew_op::log:
      return fmt::format("log{}({})", sfx, a);
    case ew_op::sqrt:
      return fmt::format("sqrt{}({})", sfx, a);
    case ew_op::rsqrt:
      return fmt::format("{} / sqrt{}({})", one, sfx, a);
    case ew_op::tanh:
      return f32 ? fmt::format("loom_tanh({})", a) : fmt::format("tanh({})", a);
    case ew_op::sigmoid:
      return f32 ? fmt::format("loom_sigmoid({})", a) : fmt::format("1.0 / (1.0 + exp(-{}))", a);
    case ew_op::relu:
      // Note [NaN rules]: the CPU's and nvcc kernels' own definition.
      return fmt::format("loom::rules::relu({})", a);
    case ew_op::gelu:
      return fmt::format("{} * {} * erfc{}(-{} * {} / {})", c(0.5), a, sfx, a,
                         c(std::numbers::sqrt2), c(2.0));
    case ew_op::gelu_tanh: {
      constexpr double k = 0.7978845608028654;  // sqrt(2 / pi)
      if (f32) {
        return fmt::format("{0} * loom_sigmoid(2.0f * ({1} * ({0} + {2} * {0} * {0} * {0})))", a,
                           float_literal(static_cast<float>(k)), float_literal(0.044715f));
      }
      return fmt::format("{0} / (1.0 + exp(-2.0 * ({1} * ({0} + {2} * {0} * {0} * {0}))))", a,
                         double_literal(k), double_literal(0.044715));
    }
    case ew_op::erf:
      return fmt::format("erf{}({})", sfx, a);
    case ew_op::square:
      return fmt::format("{0} * {0}", a);
    case ew_op::reciprocal:
      return fmt::format("{} / {}", one, a);
    case ew_op::add:
      return fmt::format("{} + {}", a, b);
    case ew_op::sub:
      return fmt::format("{} - {}", a, b);
    case ew_op::mul:
      return fmt::format("{} * {}", a, b);
    case ew_op::div:
      return fmt::format("{} / {}", a, b);
    case ew_op::pow:
      return fmt::format("pow{}({}, {})", sfx, a, b);
    case ew_op::maximum:
      // NumPy's maximum / minimum: NaN on either side gives NaN (Note [NaN rules]).
      return fmt::format("loom::rules::maximum({}, {})", a, b);
    case ew_op::minimum:
      return fmt::format("loom::rules::minimum({}, {})", a, b);
    case ew_op::relu_grad:
      // relu_grad(dy, y): dy where y > 0, else 0.
      return fmt::format("loom::rules::relu_grad({}, {})", a, b);
  }
  throw invalid_argument(
      fmt::format("fused_elementwise: no CUDA source for op {}", static_cast<int>(op)));
}

bool needs_exp(ew_op op) {
  return op == ew_op::exp || op == ew_op::tanh || op == ew_op::sigmoid || op == ew_op::gelu_tanh;
}

bool needs_rules(ew_op op) {
  return op == ew_op::relu || op == ew_op::maximum || op == ew_op::minimum ||
         op == ew_op::relu_grad;
}

// A literal as the element type t holds it, in the compute type: float16 / bfloat16 round
// (through float, as ops::scalar of the type does, and the CPU kernel), the others as
// the CPU kernel's static_cast.
double literal_of(dtype t, double v) {
  switch (t) {
    case dtype::f16:
      return static_cast<float>(half(static_cast<float>(v)));
    case dtype::bf16:
      return static_cast<float>(bfloat16(static_cast<float>(v)));
    default:
      return v;
  }
}

}  // namespace

std::string layout_key(const fused_layout& layout) {
  std::string kinds;
  for (fused_input_kind k : layout.inputs) {
    kinds += k == fused_input_kind::unused   ? 'u'
             : k == fused_input_kind::scalar ? 's'
             : k == fused_input_kind::dense  ? 'd'
                                             : 'x';
  }
  return fmt::format("{}:{}:{}", to_string(layout.type), kinds, layout.rank);
}

std::vector<bool> live_values(const fused_expr& e) {
  std::vector<bool> live(static_cast<std::size_t>(e.num_values()), false);
  for (std::int32_t r : e.results) live[static_cast<std::size_t>(r)] = true;
  for (std::size_t k = e.instrs.size(); k-- > 0;) {
    if (!live[static_cast<std::size_t>(e.num_inputs) + k]) continue;
    const fused_instr& in = e.instrs[k];
    for (int j = 0; j < info(in.op).arity; ++j) {
      const fused_operand& a = in.args[static_cast<std::size_t>(j)];
      if (!a.is_literal()) live[static_cast<std::size_t>(a.value)] = true;
    }
  }
  return live;
}

fused_index plan_fused_index(const fused_expr& e, dtype t, const std::vector<const tensor*>& inputs,
                             const shape& out) {
  if (inputs.size() != static_cast<std::size_t>(e.num_inputs)) {
    throw invalid_argument(fmt::format("fused_elementwise: {} inputs for an expression of {}",
                                       inputs.size(), e.num_inputs));
  }
  const std::vector<bool> live = live_values(e);
  const std::int64_t count = out.num_elements();
  const std::size_t rank = out.rank();
  fused_index ix;
  ix.layout.type = t;
  // Per strided input, its stride along every output dim (0 where it broadcasts).
  std::vector<std::vector<std::int64_t>> full;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const tensor& x = *inputs[i];
    const shape& s = x.shape();
    if (s.rank() > rank) {
      throw invalid_argument(
          fmt::format("fused_elementwise: input {} of shape {} does not "
                      "broadcast to {}",
                      i, to_string(s), to_string(out)));
    }
    for (std::size_t d = 0; d < s.rank(); ++d) {
      const std::int64_t od = out[rank - s.rank() + d];
      if (s[d] != od && s[d] != 1) {
        throw invalid_argument(
            fmt::format("fused_elementwise: input {} of shape {} does not "
                        "broadcast to {}",
                        i, to_string(s), to_string(out)));
      }
    }
    fused_input_kind kind = fused_input_kind::strided;
    if (!live[i]) {
      kind = fused_input_kind::unused;
    } else if (x.num_elements() == 1) {
      kind = fused_input_kind::scalar;
    } else if (x.is_contiguous() && x.num_elements() == count) {
      kind = fused_input_kind::dense;
    }
    ix.layout.inputs.push_back(kind);
    if (kind != fused_input_kind::strided) continue;
    std::vector<std::int64_t> st(rank, 0);
    for (std::size_t d = 0; d < s.rank(); ++d) {
      if (s[d] != 1) st[rank - s.rank() + d] = x.strides()[d];
    }
    full.push_back(std::move(st));
  }
  if (full.empty()) return ix;

  // Collapse: drop dims of size 1, merge a dim into the next inner one where every strided
  // input steps over the inner one contiguously.
  std::vector<std::int64_t> sizes;
  std::vector<std::vector<std::int64_t>> strides(full.size());
  for (std::size_t d = 0; d < rank; ++d) {
    if (out[d] == 1) continue;
    bool merge = !sizes.empty();
    for (std::size_t k = 0; k < full.size() && merge; ++k) {
      merge = strides[k].back() == full[k][d] * out[d];
    }
    if (merge) {
      sizes.back() *= out[d];
      for (std::size_t k = 0; k < full.size(); ++k) strides[k].back() = full[k][d];
    } else {
      sizes.push_back(out[d]);
      for (std::size_t k = 0; k < full.size(); ++k) strides[k].push_back(full[k][d]);
    }
  }
  if (sizes.empty()) {  // every dim of size 1 (a one-element output)
    sizes.push_back(1);
    for (auto& st : strides) st.push_back(0);
  }
  ix.layout.rank = static_cast<int>(sizes.size());
  ix.sizes = std::move(sizes);
  ix.strides = std::move(strides);
  return ix;
}

std::size_t kernel_param_bytes(const fused_layout& layout, std::size_t num_outputs) {
  std::size_t pointers = num_outputs;
  std::size_t strided = 0;
  for (fused_input_kind k : layout.inputs) {
    if (k != fused_input_kind::unused) ++pointers;
    if (k == fused_input_kind::strided) ++strided;
  }
  const auto rank = static_cast<std::size_t>(layout.rank);
  return 8 * (1 + pointers + rank + strided * rank);
}

std::string generate_cuda_source(const fused_expr& e, const fused_layout& layout,
                                 const std::string& kernel_name) {
  e.validate();
  if (layout.inputs.size() != static_cast<std::size_t>(e.num_inputs)) {
    throw invalid_argument(
        fmt::format("fused_elementwise: a layout of {} inputs for an "
                    "expression of {}",
                    layout.inputs.size(), e.num_inputs));
  }
  if (!is_identifier(kernel_name)) {
    throw invalid_argument(
        fmt::format("fused_elementwise: kernel name '{}' is not an identifier", kernel_name));
  }
  const dtype t = layout.type;
  if (t != dtype::f32 && t != dtype::f64 && t != dtype::f16 && t != dtype::bf16) {
    throw invalid_argument(
        fmt::format("fused_elementwise: no CUDA kernel for element type {}", to_string(t)));
  }
  const bool f32 = t != dtype::f64;  // the compute type is float
  const bool half = t == dtype::f16 || t == dtype::bf16;
  const std::string ct = f32 ? "float" : "double";
  const std::string et = half ? "unsigned short" : ct;
  const std::vector<bool> live = live_values(e);
  std::size_t num_strided = 0;
  for (std::size_t i = 0; i < layout.inputs.size(); ++i) {
    if (layout.inputs[i] == fused_input_kind::unused && live[i]) {
      throw invalid_argument(
          fmt::format("fused_elementwise: input {} is read but its layout says unused", i));
    }
    if (layout.inputs[i] == fused_input_kind::strided) ++num_strided;
  }
  if (layout.rank < 0 || (layout.rank > 0) != (num_strided > 0)) {
    throw invalid_argument(fmt::format("fused_elementwise: index rank {} with {} strided inputs",
                                       layout.rank, num_strided));
  }

  bool uses_exp = false;
  bool uses_tanh = false;
  bool uses_rules = false;
  for (std::size_t k = 0; k < e.instrs.size(); ++k) {
    if (!live[static_cast<std::size_t>(e.num_inputs) + k]) continue;
    uses_exp = uses_exp || needs_exp(e.instrs[k].op);
    uses_tanh = uses_tanh || e.instrs[k].op == ew_op::tanh;
    uses_rules = uses_rules || needs_rules(e.instrs[k].op);
  }

  std::string src;
  auto line = [&src](const std::string& s) {
    src += s;
    src += '\n';
  };
  // The expression goes in a comment: its text has no newline and no "*/" to worry about
  // in a line comment.
  line(fmt::format("// loom fused_elementwise kernel (generated), {}, layout {}", to_string(t),
                   layout_key(layout)));
  line(fmt::format("// {}", e.to_string()));
  if (t == dtype::f16) src += half_helpers;
  if (t == dtype::bf16) src += bf16_helpers;
  if (f32 && (uses_exp || uses_tanh)) src += float_exp_helper;
  if (f32 && uses_tanh) src += float_tanh_helper;
  if (uses_rules) src += rules::elementwise_rules_source;
  const auto rank = static_cast<std::size_t>(layout.rank);
  if (rank > 0) {
    line(fmt::format("struct loom_index {{ long long size[{}]; long long stride[{}][{}]; }};", rank,
                     num_strided, rank));
  }

  // Parameters.
  std::string params = "const long long n";
  for (std::size_t i = 0; i < layout.inputs.size(); ++i) {
    if (layout.inputs[i] != fused_input_kind::unused) {
      params += fmt::format(", const {}* in{}", et, i);
    }
  }
  for (std::size_t j = 0; j < e.results.size(); ++j) params += fmt::format(", {}* out{}", et, j);
  if (rank > 0) params += ", const loom_index ix";
  line(fmt::format("extern \"C\" __global__ void __launch_bounds__(256) {}({}) {{", kernel_name,
                   params));

  auto load = [&](const std::string& expr) {
    return half ? fmt::format("loom_load({})", expr) : expr;
  };
  // Scalars: once per thread.
  for (std::size_t i = 0; i < layout.inputs.size(); ++i) {
    if (layout.inputs[i] == fused_input_kind::scalar) {
      line(fmt::format("  const {} v{} = {};", ct, i, load(fmt::format("in{}[0]", i))));
    }
  }
  line("  const long long step = (long long)gridDim.x * blockDim.x;");
  line(
      "  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {");
  // Offsets of the strided inputs: i's coordinates over the collapsed dims, innermost first.
  if (rank > 0) {
    for (std::size_t k = 0; k < num_strided; ++k) line(fmt::format("    long long o{} = 0;", k));
    line("    long long r = i;");
    for (std::size_t d = rank; d-- > 1;) {
      line(fmt::format("    {{ const long long c = r % ix.size[{0}]; r /= ix.size[{0}];", d));
      for (std::size_t k = 0; k < num_strided; ++k) {
        line(fmt::format("      o{0} += c * ix.stride[{0}][{1}];", k, d));
      }
      line("    }");
    }
    for (std::size_t k = 0; k < num_strided; ++k) {
      line(fmt::format("    o{0} += r * ix.stride[{0}][0];", k));
    }
  }
  // Loads: every load of element i comes before any store (Note [fused cuda kernel]).
  {
    std::size_t k = 0;
    for (std::size_t i = 0; i < layout.inputs.size(); ++i) {
      if (layout.inputs[i] == fused_input_kind::dense) {
        line(fmt::format("    const {} v{} = {};", ct, i, load(fmt::format("in{}[i]", i))));
      } else if (layout.inputs[i] == fused_input_kind::strided) {
        line(fmt::format("    const {} v{} = {};", ct, i, load(fmt::format("in{}[o{}]", i, k++))));
      }
    }
  }
  // Instructions.
  auto operand = [&](const fused_operand& a) {
    if (!a.is_literal()) return fmt::format("v{}", a.value);
    const double lit = literal_of(t, a.literal);
    return f32 ? float_literal(static_cast<float>(lit)) : double_literal(lit);
  };
  for (std::size_t k = 0; k < e.instrs.size(); ++k) {
    const std::size_t v = static_cast<std::size_t>(e.num_inputs) + k;
    if (!live[v]) continue;
    const fused_instr& in = e.instrs[k];
    const std::string a = fmt::format("({})", operand(in.args[0]));
    const std::string b =
        info(in.op).arity == 2 ? fmt::format("({})", operand(in.args[1])) : std::string();
    // float16 / bfloat16: every value rounded to the type, as the unfused kernel stores it
    // (Note [fused element-wise semantics]).
    const std::string value = op_source(in.op, f32, a, b);
    line(fmt::format("    const {} v{} = {};  // {}", ct, v,
                     half ? fmt::format("loom_load(loom_store({}))", value) : value,
                     info(in.op).name));
  }
  // Stores.
  for (std::size_t j = 0; j < e.results.size(); ++j) {
    const std::string v = fmt::format("v{}", e.results[j]);
    line(fmt::format("    out{}[i] = {};", j, half ? fmt::format("loom_store({})", v) : v));
  }
  line("  }");
  line("}");
  return src;
}

}  // namespace loom::cuda
