// References and helpers for the array kernel tests (array_*_test.cpp): each op computed
// with plain index arithmetic on vectors of doubles, and runners that declare placeholder
// shapes other than the fed ones (so that shape errors surface at run time).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kernels/kernel_test_support.hpp"
#include "loom/core/error.hpp"
#include "loom/graph/graph.hpp"
#include "loom/kernel/kernel_registry.hpp"
#include "loom/kernel/variable_store.hpp"

namespace loom::testing::array_ref {

using ints = std::vector<std::int64_t>;
using doubles = std::vector<double>;

inline std::vector<dtype> all_dtypes() {
  return {dtype::f32, dtype::f64, dtype::f16, dtype::bf16,   dtype::i32,
          dtype::i64, dtype::i8,  dtype::u8,  dtype::boolean};
}

inline std::int64_t count(const ints& s) {
  std::int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

inline ints unravel(std::int64_t flat, const ints& s) {
  ints idx(s.size(), 0);
  for (std::size_t k = s.size(); k-- > 0;) {
    idx[k] = flat % s[k];
    flat /= s[k];
  }
  return idx;
}

inline std::int64_t ravel(const ints& idx, const ints& s) {
  std::int64_t flat = 0;
  for (std::size_t k = 0; k < s.size(); ++k) flat = flat * s[k] + idx[k];
  return flat;
}

inline shape to_shape(const ints& s) {
  return shape(s);
}

/// out[i0..] = v[idx with idx[perm[k]] = i_k].
inline doubles transpose(const doubles& v, const ints& s, const ints& perm, ints* out_shape) {
  ints o(s.size());
  for (std::size_t k = 0; k < s.size(); ++k) o[k] = s[static_cast<std::size_t>(perm[k])];
  doubles out(static_cast<std::size_t>(count(o)));
  for (std::int64_t f = 0; f < count(o); ++f) {
    const ints io = unravel(f, o);
    ints ii(s.size());
    for (std::size_t k = 0; k < s.size(); ++k) ii[static_cast<std::size_t>(perm[k])] = io[k];
    out[static_cast<std::size_t>(f)] = v[static_cast<std::size_t>(ravel(ii, s))];
  }
  if (out_shape != nullptr) *out_shape = o;
  return out;
}

/// The block at `begin` of extent `size` (sizes resolved, no -1).
inline doubles slice(const doubles& v, const ints& s, const ints& begin, const ints& size) {
  doubles out(static_cast<std::size_t>(count(size)));
  for (std::int64_t f = 0; f < count(size); ++f) {
    ints idx = unravel(f, size);
    for (std::size_t k = 0; k < s.size(); ++k) idx[k] += begin[k];
    out[static_cast<std::size_t>(f)] = v[static_cast<std::size_t>(ravel(idx, s))];
  }
  return out;
}

/// Inputs (values, shape) joined along `axis` (non-negative).
inline doubles concat(const std::vector<std::pair<doubles, ints>>& parts, std::size_t axis,
                      ints* out_shape) {
  ints o = parts.at(0).second;
  o[axis] = 0;
  for (const auto& p : parts) o[axis] += p.second[axis];
  doubles out(static_cast<std::size_t>(count(o)));
  for (std::int64_t f = 0; f < count(o); ++f) {
    ints idx = unravel(f, o);
    std::size_t which = 0;
    while (idx[axis] >= parts[which].second[axis]) idx[axis] -= parts[which++].second[axis];
    out[static_cast<std::size_t>(f)] =
        parts[which].first[static_cast<std::size_t>(ravel(idx, parts[which].second))];
  }
  if (out_shape != nullptr) *out_shape = o;
  return out;
}

/// NumPy take along `axis` (non-negative; indices valid).
inline doubles gather(const doubles& p, const ints& ps, const ints& indices, const ints& is,
                      std::size_t axis, ints* out_shape) {
  ints o(ps.begin(), ps.begin() + static_cast<std::ptrdiff_t>(axis));
  o.insert(o.end(), is.begin(), is.end());
  o.insert(o.end(), ps.begin() + static_cast<std::ptrdiff_t>(axis) + 1, ps.end());
  doubles out(static_cast<std::size_t>(count(o)));
  for (std::int64_t f = 0; f < count(o); ++f) {
    const ints io = unravel(f, o);
    ints ip(io.begin(), io.begin() + static_cast<std::ptrdiff_t>(axis));
    const ints ii(io.begin() + static_cast<std::ptrdiff_t>(axis),
                  io.begin() + static_cast<std::ptrdiff_t>(axis + is.size()));
    ip.push_back(indices[static_cast<std::size_t>(ravel(ii, is))]);
    ip.insert(ip.end(), io.begin() + static_cast<std::ptrdiff_t>(axis + is.size()), io.end());
    out[static_cast<std::size_t>(f)] = p[static_cast<std::size_t>(ravel(ip, ps))];
  }
  if (out_shape != nullptr) *out_shape = o;
  return out;
}

/// TensorFlow's one_hot; axis in [0, rank] (already resolved from -1).
inline doubles one_hot(const ints& indices, const ints& is, std::int64_t depth, double on,
                       double off, std::size_t axis, ints* out_shape) {
  ints o = is;
  o.insert(o.begin() + static_cast<std::ptrdiff_t>(axis), depth);
  doubles out(static_cast<std::size_t>(count(o)));
  for (std::int64_t f = 0; f < count(o); ++f) {
    ints io = unravel(f, o);
    const std::int64_t d = io[axis];
    io.erase(io.begin() + static_cast<std::ptrdiff_t>(axis));
    out[static_cast<std::size_t>(f)] =
        indices[static_cast<std::size_t>(ravel(io, is))] == d ? on : off;
  }
  if (out_shape != nullptr) *out_shape = o;
  return out;
}

/// Expects `out` to have shape `s` and exactly the elements `expected`.
inline void expect_exact(const tensor& out, const ints& s, const doubles& expected) {
  expect_close(out, to_shape(s), expected, 0.0, 0.0);
}

/// A host index tensor of dtype t (int32 or int64) and shape s holding v.
inline tensor index_tensor(dtype t, const ints& s, const ints& v) {
  return make(t, to_shape(s), doubles(v.begin(), v.end()));
}

/// run_op with declared shapes: see run_op_declared in kernel_test_support.hpp.
inline std::vector<tensor> run_declared(std::string_view op, std::vector<tensor> inputs,
                                        const std::vector<shape>& declared, attr_map attrs = {}) {
  return run_op_declared(op, std::move(inputs), declared, std::move(attrs));
}

/// Expects f() to throw loom::invalid_argument (a construction error) naming the node
/// 'under_test' and containing `part`.
inline void expect_invalid(const std::function<void()>& f, const std::string& part) {
  try {
    f();
    ADD_FAILURE() << "expected loom::invalid_argument containing '" << part << "'";
  } catch (const node_error& e) {
    ADD_FAILURE() << "expected a construction error, got a node_error: " << e.what();
  } catch (const invalid_argument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("under_test"), std::string::npos) << what;
    EXPECT_NE(what.find(part), std::string::npos) << "'" << part << "' not in: " << what;
  }
}

/// Expects f() to throw loom::node_error for node 'under_test' containing `part`.
inline void expect_node_error(const std::function<void()>& f, const std::string& part) {
  try {
    f();
    ADD_FAILURE() << "expected loom::node_error containing '" << part << "'";
  } catch (const node_error& e) {
    const std::string what = e.what();
    EXPECT_EQ(e.node_name(), "under_test");
    EXPECT_NE(what.find("under_test"), std::string::npos) << what;
    EXPECT_NE(what.find(part), std::string::npos) << "'" << part << "' not in: " << what;
  }
}

/// A view of the 1-D tensor x taking every `step`-th element of a bigger buffer (a
/// non-contiguous rank-1 input, which non_contiguous() cannot make).
inline tensor every_other(const tensor& x, std::int64_t step = 2) {
  const auto v = values(x);
  doubles wide(v.size() * static_cast<std::size_t>(step), -7.0);
  for (std::size_t i = 0; i < v.size(); ++i) wide[i * static_cast<std::size_t>(step)] = v[i];
  const tensor base = make(x.type(), shape{static_cast<std::int64_t>(wide.size())}, wide);
  return tensor::strided(base.buf(), x.type(), x.shape(), shape{step}, 0);
}

}  // namespace loom::testing::array_ref
