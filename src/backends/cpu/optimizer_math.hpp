// The element math of the optimizers: one inline function per optimizer, used by the
// per-tensor kernels (apply_sgd, apply_adam, apply_adamw) and by the fused multi-tensor
// kernels alike, so the two agree bitwise by construction (Note [optimizer element math]).
//
// Note [optimizer element math]
// Every storage type (f32, f16, bf16 parameters; f32/bf16 moments; f32/f16/bf16 gradients)
// is widened to float, the update is computed in float, and the results are rounded back.
// The operations follow PyTorch's single-tensor (foreach=False) code, one rounding per
// PyTorch tensor op, in the same order:
//   Adam:  if wd: g = g + wd*p                       grad.add(param, alpha=wd)
//          m = m + w*(g - m)  (w = 1-beta1 < 0.5)     exp_avg.lerp_(grad, 1-beta1)
//            = g - (g - m)*(1 - w)  (w >= 0.5)        (torch's lerp for large weights)
//          v = v*beta2 + ((1-beta2)*g)*g             exp_avg_sq.mul_(beta2).addcmul_(g, g, 1-beta2)
//          denom = sqrt(v)/sqrt(bc2) + eps           (exp_avg_sq.sqrt() / bc2_sqrt).add_(eps)
//          p = p - (step_size*m)/denom               param.addcdiv_(exp_avg, denom, -step_size)
//   AdamW: p = p*(1 - lr*wd) first, then Adam without the L2 term.
//   SGD:   if wd: g = g + wd*p; if momentum: buf = g on the first step, else
//          buf = buf*momentum + (1-dampening)*g; g = nesterov ? g + momentum*buf : buf;
//          p = p - lr*g.
// The per-call constants (bc1 = 1 - beta1^step, bc2, step_size = lr/bc1, sqrt(bc2),
// 1 - lr*wd, ...) are computed once in double and rounded to float, as PyTorch does with
// its Python-float hyperparameters. Nothing here may be reassociated or contracted: the
// library is built without -ffast-math and for baseline x86-64 (no FMA), and vector and
// scalar code give the same IEEE results, so a chunk's elements come out the same however
// the chunk is cut or vectorised.
//
// PyTorch's own vectorised CPU kernels contract some of these steps into FMAs (lerp,
// add with alpha), so loom matches PyTorch's *rules* exactly and PyTorch's bits to within
// a few ulps, not bitwise.
#pragma once

#include <cmath>
#include <cstdint>

namespace loom::cpu::optim {

/// How the fused kernels turn a stored gradient into the one the update uses:
/// g = (g / scale) * clip. Both are 1 for the per-tensor kernels.
struct grad_transform {
  float scale = 1.0f;  // the loss scale (grads are divided by it)
  float clip = 1.0f;   // the clipping coefficient min(1, max_norm / (norm + 1e-6))

  [[nodiscard]] bool is_identity() const noexcept { return scale == 1.0f && clip == 1.0f; }
};

template <bool Identity>
inline float transform_grad(float g, const grad_transform& t) {
  // x / 1 and x * 1 are exact, so the identity case is only a shortcut.
  if constexpr (Identity) {
    return g;
  } else {
    return (g / t.scale) * t.clip;
  }
}

// ---- Adam / AdamW --------------------------------------------------------------------

/// Adam's per-call constants, rounded to float once per call.
struct adam_constants {
  float l2 = 0.0f;           // Adam's weight decay, added to the gradient (0: none)
  float decay = 1.0f;        // AdamW's decoupled factor 1 - lr*wd (exactly 1 for Adam)
  float lerp_weight = 0.1f;  // 1 - beta1
  bool lerp_small = true;    // lerp_weight < 0.5: torch's lerp takes its first form
  float beta2 = 0.999f;
  float one_minus_beta2 = 0.001f;
  float bc2_sqrt = 1.0f;  // sqrt(1 - beta2^step)
  float eps = 1e-8f;
  float step_size = 0.0f;  // lr / (1 - beta1^step)
};

/// The constants for one call: `lr` the learning rate, `step` the 1-based step number.
inline adam_constants make_adam_constants(double lr, std::int64_t step, double beta1, double beta2,
                                          double eps, double weight_decay, bool decoupled) {
  adam_constants c;
  const double t = static_cast<double>(step);
  const double bc1 = 1.0 - std::pow(beta1, t);
  const double bc2 = 1.0 - std::pow(beta2, t);
  c.l2 = decoupled ? 0.0f : static_cast<float>(weight_decay);
  c.decay = decoupled ? static_cast<float>(1.0 - lr * weight_decay) : 1.0f;
  c.lerp_weight = static_cast<float>(1.0 - beta1);
  c.lerp_small = std::abs(c.lerp_weight) < 0.5f;
  c.beta2 = static_cast<float>(beta2);
  c.one_minus_beta2 = static_cast<float>(1.0 - beta2);
  c.bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  c.eps = static_cast<float>(eps);
  c.step_size = static_cast<float>(lr / bc1);
  return c;
}

/// One element of Adam/AdamW: p the weight (master or param), g the gradient, m and v the
/// moments, all in float. L2: the gradient gets wd*p (Adam with weight decay); SmallWeight:
/// c.lerp_small.
template <bool L2, bool SmallWeight>
inline void adam_element(float& p, float g, float& m, float& v, const adam_constants& c) {
  p = p * c.decay;
  if constexpr (L2) g = g + c.l2 * p;
  if constexpr (SmallWeight) {
    m = m + c.lerp_weight * (g - m);
  } else {
    m = g - (g - m) * (1.0f - c.lerp_weight);
  }
  v = v * c.beta2 + c.one_minus_beta2 * g * g;
  const float denom = std::sqrt(v) / c.bc2_sqrt + c.eps;
  p = p - c.step_size * m / denom;
}

template <bool Identity, bool L2, bool SmallWeight>
inline void adam_loop(float* __restrict p, const float* __restrict g, float* __restrict m,
                      float* __restrict v, std::int64_t n, const adam_constants& c,
                      const grad_transform& t) {
  for (std::int64_t i = 0; i < n; ++i) {
    adam_element<L2, SmallWeight>(p[i], transform_grad<Identity>(g[i], t), m[i], v[i], c);
  }
}

/// Adam over n dense float elements, in place on p, m and v.
inline void adam_update(float* p, const float* g, float* m, float* v, std::int64_t n,
                        const adam_constants& c, const grad_transform& t) {
  const bool id = t.is_identity();
  const bool l2 = c.l2 != 0.0f;
  // Uniform choices become template arguments, so each loop is branch-free and vectorises.
  if (id && !l2 && c.lerp_small) return adam_loop<true, false, true>(p, g, m, v, n, c, t);
  if (id && l2 && c.lerp_small) return adam_loop<true, true, true>(p, g, m, v, n, c, t);
  if (!id && !l2 && c.lerp_small) return adam_loop<false, false, true>(p, g, m, v, n, c, t);
  if (!id && l2 && c.lerp_small) return adam_loop<false, true, true>(p, g, m, v, n, c, t);
  if (id && !l2) return adam_loop<true, false, false>(p, g, m, v, n, c, t);
  if (id && l2) return adam_loop<true, true, false>(p, g, m, v, n, c, t);
  if (!l2) return adam_loop<false, false, false>(p, g, m, v, n, c, t);
  return adam_loop<false, true, false>(p, g, m, v, n, c, t);
}

// ---- SGD -----------------------------------------------------------------------------

/// SGD's per-call constants, rounded to float once per call.
struct sgd_constants {
  float lr = 0.0f;
  float weight_decay = 0.0f;
  float momentum = 0.0f;
  float one_minus_dampening = 1.0f;
  bool nesterov = false;
};

inline sgd_constants make_sgd_constants(double lr, double momentum, double dampening,
                                        double weight_decay, bool nesterov) {
  return {static_cast<float>(lr), static_cast<float>(weight_decay), static_cast<float>(momentum),
          static_cast<float>(1.0 - dampening), nesterov};
}

/// One element of SGD. buf: the momentum buffer (unused without Momentum); First: the
/// buffer did not exist before this step (it becomes the gradient).
template <bool L2, bool Momentum, bool First, bool Nesterov>
inline void sgd_element(float& p, float g, float& buf, const sgd_constants& c) {
  if constexpr (L2) g = g + c.weight_decay * p;
  if constexpr (Momentum) {
    if constexpr (First) {
      buf = g;
    } else {
      buf = buf * c.momentum + c.one_minus_dampening * g;
    }
    if constexpr (Nesterov) {
      g = g + c.momentum * buf;
    } else {
      g = buf;
    }
  }
  p = p - c.lr * g;
}

template <bool Identity, bool L2, bool Momentum, bool First, bool Nesterov>
inline void sgd_loop(float* __restrict p, const float* __restrict g, float* __restrict buf,
                     std::int64_t n, const sgd_constants& c, const grad_transform& t) {
  if constexpr (Momentum) {
    for (std::int64_t i = 0; i < n; ++i) {
      sgd_element<L2, true, First, Nesterov>(p[i], transform_grad<Identity>(g[i], t), buf[i], c);
    }
  } else {
    float unused = 0.0f;
    for (std::int64_t i = 0; i < n; ++i) {
      sgd_element<L2, false, false, false>(p[i], transform_grad<Identity>(g[i], t), unused, c);
    }
  }
}

template <bool Identity, bool L2>
inline void sgd_dispatch(float* p, const float* g, float* buf, std::int64_t n,
                         const sgd_constants& c, const grad_transform& t, bool first) {
  const bool momentum = c.momentum != 0.0f;
  if (!momentum) return sgd_loop<Identity, L2, false, false, false>(p, g, buf, n, c, t);
  if (first) {
    if (c.nesterov) return sgd_loop<Identity, L2, true, true, true>(p, g, buf, n, c, t);
    return sgd_loop<Identity, L2, true, true, false>(p, g, buf, n, c, t);
  }
  if (c.nesterov) return sgd_loop<Identity, L2, true, false, true>(p, g, buf, n, c, t);
  return sgd_loop<Identity, L2, true, false, false>(p, g, buf, n, c, t);
}

/// SGD over n dense float elements, in place on p and buf (buf may be null without
/// momentum). first: the momentum buffer is new this step.
inline void sgd_update(float* p, const float* g, float* buf, std::int64_t n, const sgd_constants& c,
                       const grad_transform& t, bool first) {
  const bool id = t.is_identity();
  const bool l2 = c.weight_decay != 0.0f;
  if (id && !l2) return sgd_dispatch<true, false>(p, g, buf, n, c, t, first);
  if (id) return sgd_dispatch<true, true>(p, g, buf, n, c, t, first);
  if (!l2) return sgd_dispatch<false, false>(p, g, buf, n, c, t, first);
  return sgd_dispatch<false, true>(p, g, buf, n, c, t, first);
}

}  // namespace loom::cpu::optim
