// A session's variables to and from safetensors files.
#include "loom/checkpoint/checkpoint.hpp"

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <mutex>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "loom/checkpoint/safetensors.hpp"
#include "loom/core/error.hpp"
#include "loom/device/device.hpp"
#include "loom/memory/device_resources.hpp"
#include "loom/runtime/session.hpp"

namespace loom::checkpoint {
namespace {

std::string type_text(dtype t, const shape& s) {
  return fmt::format("{}{}", to_string(t), to_string(s));
}

// The session's device of this id, or nullptr.
device* find_device(session& s, device_id id) {
  for (const auto& d : s.devices()) {
    if (d->id() == id) return d.get();
  }
  return nullptr;
}

// The value of the variable (a reference to its buffer), or an undefined tensor.
tensor current_value(variable_store& store, const std::string& name) {
  variable_store::variable* var = store.find(name);
  if (var == nullptr) return {};
  std::lock_guard lock(var->mutex);
  return var->value;
}

// The index of the first NaN or Inf of a contiguous host tensor, or -1 (also for tensors
// that are not floating-point).
std::int64_t first_nonfinite(const tensor& t) {
  const auto n = static_cast<std::size_t>(t.num_elements());
  const auto find = [n](const auto* p, auto is_finite) -> std::int64_t {
    for (std::size_t i = 0; i < n; ++i) {
      if (!is_finite(p[i])) return static_cast<std::int64_t>(i);
    }
    return -1;
  };
  switch (t.type()) {
    case dtype::f32:
      return find(static_cast<const float*>(t.raw_data()),
                  [](float v) { return std::isfinite(v); });
    case dtype::f64:
      return find(static_cast<const double*>(t.raw_data()),
                  [](double v) { return std::isfinite(v); });
    case dtype::f16:  // exponent all ones: Inf or NaN
      return find(static_cast<const std::uint16_t*>(t.raw_data()),
                  [](std::uint16_t v) { return (v & 0x7C00U) != 0x7C00U; });
    case dtype::bf16:
      return find(static_cast<const std::uint16_t*>(t.raw_data()),
                  [](std::uint16_t v) { return (v & 0x7F80U) != 0x7F80U; });
    default:
      return -1;
  }
}

// Element i of a floating-point host tensor, for messages.
std::string element_text(const tensor& t, std::int64_t i) {
  const auto k = static_cast<std::size_t>(i);
  switch (t.type()) {
    case dtype::f32:
      return fmt::format("{}", static_cast<const float*>(t.raw_data())[k]);
    case dtype::f64:
      return fmt::format("{}", static_cast<const double*>(t.raw_data())[k]);
    default: {
      const std::uint16_t bits = static_cast<const std::uint16_t*>(t.raw_data())[k];
      const bool nan = t.type() == dtype::f16 ? (bits & 0x03FFU) != 0 : (bits & 0x007FU) != 0;
      return nan ? "nan" : ((bits & 0x8000U) != 0 ? "-inf" : "inf");
    }
  }
}

std::string join(const std::vector<std::string>& parts, std::string_view sep) {
  std::string out;
  for (const auto& p : parts) {
    if (!out.empty()) out += sep;
    out += p;
  }
  return out;
}

}  // namespace

// Holding a reference to each value is enough for a consistent snapshot: an update writes
// a variable's buffer in place only when nothing else references it (variable_store.hpp),
// so while this holds the reference, updates go to a new buffer.
void save_checkpoint(session& s, const std::filesystem::path& path,
                     const std::map<std::string, std::string>& metadata) {
  variable_store& store = s.variables();
  std::vector<std::pair<std::string, tensor>> values;
  for (const std::string& name : store.names()) {
    tensor value = current_value(store, name);
    if (!value.defined()) continue;
    values.emplace_back(name, s.host_value(value));
  }
  save_safetensors(path, values, metadata);
}

// Note [checkpoint restore]
// A restore that fails halfway would leave a model with some layers from the checkpoint
// and some from before, which trains on without complaint. So restore_checkpoint works in
// three passes: check every tensor of the file (against the graph's `variable` nodes, whose
// dtype and shape attributes are the declaration, and against the values in the store,
// which also cover state that kernels create, such as optimizer moments) and every declared
// variable for a value; then copy every value onto its device (where an allocation may still
// fail); and only then assign, each under its variable's mutex. Errors list every variable
// that is wrong, not just the first, so one attempt shows everything to fix.
std::map<std::string, std::string> restore_checkpoint(session& s, const std::filesystem::path& path,
                                                      const restore_options& options) {
  safetensors_file file = load_safetensors(path);
  if (options.check_metadata) options.check_metadata(file.metadata);
  variable_store& store = s.variables();

  struct declaration {
    dtype type;
    shape dims;
  };
  std::map<std::string, declaration, std::less<>> declared;
  for (const node& n : s.get_graph().nodes()) {
    if (n.op() == "variable")
      declared.emplace(n.name, declaration{n.attr<dtype>("dtype"), n.attr<shape>("shape")});
  }

  struct restored {
    std::string name;
    tensor value;
    std::optional<device_id> device;  // where the value it replaces lives
  };
  std::vector<restored> plan;
  std::vector<std::string> mismatches;
  std::vector<std::string> unknown;
  std::set<std::string, std::less<>> in_file;
  for (auto& [name, t] : file.tensors) {
    in_file.insert(name);
    const tensor current = current_value(store, name);
    const auto it = declared.find(name);
    if (it != declared.end() && (it->second.type != t.type() || it->second.dims != t.shape())) {
      mismatches.push_back(fmt::format("variable '{}': the graph declares {}, the file holds {}",
                                       name, type_text(it->second.type, it->second.dims),
                                       type_text(t.type(), t.shape())));
      continue;
    }
    const auto state = options.expected_state.find(name);
    if (state != options.expected_state.end() &&
        (state->second.type != t.type() || state->second.dims != t.shape())) {
      mismatches.push_back(fmt::format("state '{}': the session expects {}, the file holds {}",
                                       name, type_text(state->second.type, state->second.dims),
                                       type_text(t.type(), t.shape())));
      continue;
    }
    if (current.defined() && (current.type() != t.type() || current.shape() != t.shape())) {
      mismatches.push_back(fmt::format("variable '{}': its value is {}, the file holds {}", name,
                                       type_text(current.type(), current.shape()),
                                       type_text(t.type(), t.shape())));
      continue;
    }
    if (!options.allow_unknown && it == declared.end() && state == options.expected_state.end() &&
        !current.defined()) {
      unknown.push_back(fmt::format("'{}' ({})", name, type_text(t.type(), t.shape())));
      continue;
    }
    if (options.refuse_nonfinite) {
      if (const std::int64_t bad = first_nonfinite(t); bad >= 0) {
        mismatches.push_back(fmt::format("tensor '{}' ({}) holds {} at element {}", name,
                                         type_text(t.type(), t.shape()), element_text(t, bad),
                                         bad));
        continue;
      }
    }
    plan.push_back(
        {name, std::move(t), current.defined() ? std::optional(current.device()) : std::nullopt});
  }
  if (!unknown.empty()) {
    mismatches.push_back(fmt::format(
        "tensor{} {} {} no variable of the session (a checkpoint of another model or "
        "optimizer?)",
        unknown.size() == 1 ? "" : "s", join(unknown, ", "), unknown.size() == 1 ? "is" : "are"));
  }
  if (!mismatches.empty()) {
    throw invalid_argument(
        fmt::format("restore_checkpoint: '{}' does not fit the session ({}); "
                    "no variable was changed",
                    path.string(), join(mismatches, "; ")));
  }
  if (!options.allow_missing) {
    std::vector<std::string> missing;
    for (const auto& [name, d] : declared) {
      if (!in_file.contains(name)) {
        missing.push_back(fmt::format("'{}' ({})", name, type_text(d.type, d.dims)));
      }
    }
    if (!missing.empty()) {
      throw not_found(
          fmt::format("restore_checkpoint: '{}' has no value for variable{} {} of the "
                      "graph (restore_options::allow_missing keeps their values); "
                      "no variable was changed",
                      path.string(), missing.size() == 1 ? "" : "s", join(missing, ", ")));
    }
  }

  for (auto& r : plan) {
    if (!r.device) continue;  // stays in host memory (cpu:0)
    if (device* d = find_device(s, *r.device)) {
      r.value = d->copy_from_host(r.value);
    } else if (!is_host_accessible(r.device->type)) {
      throw error(
          fmt::format("restore_checkpoint: variable '{}' lives on {}, which is no device "
                      "of the session; no variable was changed",
                      r.name, to_string(*r.device)));
    }
  }

  for (auto& r : plan) {
    variable_store::variable& var = store.get(r.name);
    std::lock_guard lock(var.mutex);
    var.value = std::move(r.value);
  }
  return std::move(file.metadata);
}

}  // namespace loom::checkpoint
