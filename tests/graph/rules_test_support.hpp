// What the op rules' tests share: the message a rule fails with, and a small host tensor
// for the rules that take tensors (their messages name its dtype, shape and device).
#pragma once

#include <cstddef>
#include <string>

#include "loom/core/buffer.hpp"
#include "loom/core/error.hpp"
#include "loom/core/tensor.hpp"

namespace loom::rules_test {

/// The message of the loom::invalid_argument `f()` throws, or "no error" (f may return
/// nothing).
template <class F>
std::string message_of(F&& f) {
  try {
    (void)f();
  } catch (const invalid_argument& e) {
    return e.what();
  }
  return "no error";
}

/// A tensor of dtype `t` and shape `s` on the CPU, borrowing a shared zeroed arena: the rules
/// only read shapes and dtypes. `s` must be fully defined and fit in 4 KiB.
inline tensor host_tensor(dtype t, shape s) {
  alignas(64) static std::byte arena[4096] = {};
  return tensor(buffer::adopt(arena, sizeof(arena), 64, device_id{}, {}, nullptr, nullptr), t,
                std::move(s));
}

}  // namespace loom::rules_test
