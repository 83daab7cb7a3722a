// Test support for the optimizer tests: float64 reference implementations of PyTorch's
// published update rules (written from torch.optim's documentation, independently of
// loom's code), and small helpers to run optimizer graphs through sessions.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "kernel_test_support.hpp"
#include "loom/graph/ops.hpp"
#include "loom/kernel/variable_store.hpp"
#include "loom/memory/tensor_allocation.hpp"
#include "loom/runtime/session.hpp"

namespace loom::testing::optim {

/// Adam/AdamW hyperparameters for the reference (lr as the f32 value the graph holds).
struct adam_ref_params {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool adamw = false;
};

/// One parameter's float64 Adam state.
struct adam_ref_state {
  std::vector<double> p, m, v;
};

/// torch.optim.Adam / AdamW, step t (1-based), in float64:
///   AdamW: p *= 1 - lr*wd;  Adam: g += wd*p
///   m = beta1*m + (1-beta1)*g;  v = beta2*v + (1-beta2)*g^2
///   p -= lr/(1-beta1^t) * m / (sqrt(v)/sqrt(1-beta2^t) + eps)
inline void adam_ref_step(adam_ref_state& s, const std::vector<double>& g, std::int64_t t,
                          const adam_ref_params& h) {
  const double bc1 = 1.0 - std::pow(h.beta1, static_cast<double>(t));
  const double bc2 = 1.0 - std::pow(h.beta2, static_cast<double>(t));
  for (std::size_t i = 0; i < g.size(); ++i) {
    double p = s.p[i];
    double gi = g[i];
    if (h.adamw) {
      p *= 1.0 - h.lr * h.weight_decay;
    } else if (h.weight_decay != 0.0) {
      gi += h.weight_decay * p;
    }
    s.m[i] = h.beta1 * s.m[i] + (1.0 - h.beta1) * gi;
    s.v[i] = h.beta2 * s.v[i] + (1.0 - h.beta2) * gi * gi;
    const double denom = std::sqrt(s.v[i]) / std::sqrt(bc2) + h.eps;
    s.p[i] = p - h.lr / bc1 * s.m[i] / denom;
  }
}

/// SGD hyperparameters for the reference.
struct sgd_ref_params {
  double lr = 0.01;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
};

/// torch.optim.SGD in float64: g += wd*p; buf = g (first step) or momentum*buf +
/// (1-dampening)*g; g = nesterov ? g + momentum*buf : buf; p -= lr*g.
inline void sgd_ref_step(std::vector<double>& p, std::vector<double>& buf, bool first,
                         const std::vector<double>& g, const sgd_ref_params& h) {
  for (std::size_t i = 0; i < g.size(); ++i) {
    double gi = g[i];
    if (h.weight_decay != 0.0) gi += h.weight_decay * p[i];
    if (h.momentum != 0.0) {
      buf[i] = first ? gi : h.momentum * buf[i] + (1.0 - h.dampening) * gi;
      gi = h.nesterov ? gi + h.momentum * buf[i] : buf[i];
    }
    p[i] -= h.lr * gi;
  }
}

/// The distance between adjacent floats at |x| (the f32 ulp).
inline double ulp_f32(double x) {
  const float f = static_cast<float>(std::abs(x));
  return static_cast<double>(std::nextafter(f, std::numeric_limits<float>::infinity()) - f);
}

/// The value of store variable `name` (fails the test when missing).
inline tensor var_value(session& s, const std::string& name) {
  auto* v = s.variables().find(name);
  if (v == nullptr) {
    ADD_FAILURE() << "no variable " << name;
    return {};
  }
  return v->value;
}

/// True when both tensors are defined with equal dtype, shape and bytes.
inline bool same_bits(const tensor& a, const tensor& b) {
  if (!a.defined() || !b.defined()) return a.defined() == b.defined();
  if (a.type() != b.type() || a.shape() != b.shape()) return false;
  return a.nbytes() == 0 || std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

/// A host copy (so a later in-place update cannot change it).
inline tensor snapshot(const tensor& t) {
  if (!t.defined()) return {};
  tensor out = memory::host_tensor(t.type(), t.shape());
  if (t.nbytes() > 0) std::memcpy(out.raw_data(), t.raw_data(), t.nbytes());
  return out;
}

/// An i64 scalar host tensor.
inline tensor i64_scalar(std::int64_t v) {
  tensor t = memory::host_tensor(dtype::i64, shape{});
  *t.data<std::int64_t>() = v;
  return t;
}

/// An f32 host tensor of shape s holding `values` rounded to f32.
inline tensor f32_tensor(const shape& s, const std::vector<double>& values) {
  return make(dtype::f32, s, values);
}

}  // namespace loom::testing::optim
