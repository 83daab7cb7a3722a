// checkpoint: a session's variables saved to, and restored from, a safetensors file.
//
// A checkpoint is every variable of a session's variable_store that has a value, one
// tensor per variable under the variable's name, in a safetensors file (Note [safetensors
// format] in safetensors.hpp) written atomically; metadata (the step, the format, ...)
// travels in its "__metadata__". Restoring checks the whole file against the graph and the
// store before it changes anything (Note [checkpoint restore] in src/checkpoint/checkpoint.cpp).
//
// Thread safety: both take each variable's mutex while they read or write its value, so
// they may run while the session runs; a checkpoint saved during a run holds each variable
// whole, but not necessarily all from the same step.
#pragma once

#include <filesystem>
#include <functional>
#include <map>
#include <string>

#include "loom/core/dtype.hpp"
#include "loom/core/shape.hpp"

namespace loom {
class session;
}

namespace loom::checkpoint {

/// Writes every variable of `s` that has a value (sorted by name; copied from devices the
/// CPU cannot read) and `metadata` (e.g. {"format": "loom", "step": "1200"}) to `path`, as
/// save_safetensors does: atomically, replacing the file. Throws as save_safetensors
/// (loom::error naming the path when a file operation fails; the old file is then intact).
void save_checkpoint(session& s, const std::filesystem::path& path,
                     const std::map<std::string, std::string>& metadata = {});

/// A tensor's dtype and shape, as restore_options::expected_state declares one.
struct tensor_spec {
  dtype type = dtype::f32;
  shape dims;
};

struct restore_options {
  /// Let variables the graph declares be absent from the file (they keep their values).
  bool allow_missing = false;
  /// Let the file hold tensors that are neither variables of the graph, nor variables of
  /// the store, nor in expected_state; each becomes a new variable. false: such tensors are
  /// an error (a checkpoint of another model or optimizer).
  bool allow_unknown = true;
  /// State that kernels create on their first step (optimizer moments, "w/adam_m"), which
  /// a fresh session does not hold yet: the file may hold these, and when it does, with
  /// this dtype and shape.
  std::map<std::string, tensor_spec> expected_state;
  /// Refuse floating-point tensors that hold NaN or Inf.
  bool refuse_nonfinite = false;
  /// Called with the file's metadata before any tensor is checked; it throws to refuse the
  /// file (an epoch that does not parse, another optimizer's checkpoint, ...).
  std::function<void(const std::map<std::string, std::string>&)> check_metadata;
};

/// Loads the checkpoint at `path` into the variables of `s`, and returns its metadata.
/// Every tensor of the file must match, in dtype and shape, the `variable` node of its name
/// when the graph has one, its options.expected_state entry when it has one, and the
/// variable's current value when the store has one; a tensor that is none of these
/// (optimizer state that kernels create) becomes a new variable, or is an error when
/// !options.allow_unknown. A variable the graph declares that the file lacks is an error
/// unless `options.allow_missing`. A restored value lives on the device of the value it
/// replaces, or in host memory (cpu:0) when the variable had none. Throws, having changed
/// no variable: as load_safetensors (loom::not_found, loom::error, loom::parse_error naming
/// the path); as options.check_metadata; loom::invalid_argument for a dtype or shape
/// mismatch, an unknown tensor, or (with options.refuse_nonfinite) a NaN or Inf, and
/// loom::not_found for a missing variable, naming each variable, what was expected, what
/// the file holds, and the path; loom::out_of_memory when a device cannot hold the values.
std::map<std::string, std::string> restore_checkpoint(session& s, const std::filesystem::path& path,
                                                      const restore_options& options = {});

}  // namespace loom::checkpoint
