// A session's variables to and from safetensors files.
#include "loom/checkpoint/checkpoint.hpp"

#include <fmt/format.h>

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
  std::set<std::string, std::less<>> in_file;
  for (auto& [name, t] : file.tensors) {
    in_file.insert(name);
    const tensor current = current_value(store, name);
    if (auto it = declared.find(name);
        it != declared.end() && (it->second.type != t.type() || it->second.dims != t.shape())) {
      mismatches.push_back(fmt::format("variable '{}': the graph declares {}, the file holds {}",
                                       name, type_text(it->second.type, it->second.dims),
                                       type_text(t.type(), t.shape())));
      continue;
    }
    if (current.defined() && (current.type() != t.type() || current.shape() != t.shape())) {
      mismatches.push_back(fmt::format("variable '{}': its value is {}, the file holds {}", name,
                                       type_text(current.type(), current.shape()),
                                       type_text(t.type(), t.shape())));
      continue;
    }
    plan.push_back(
        {name, std::move(t), current.defined() ? std::optional(current.device()) : std::nullopt});
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
