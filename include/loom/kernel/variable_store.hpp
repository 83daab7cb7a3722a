// variable_store: the variables of a session, by name, living on their devices across runs.
//
// A variable's value is a tensor on the variable's device. Reads share the buffer (a read
// is a reference, not a copy); assignments replace the tensor, or update it in place when
// no read still holds it. Each variable has a mutex that readers and writers of its value
// take, so concurrent runs see whole values. Thread-safe.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "loom/core/tensor.hpp"

namespace loom {

class variable_store {
 public:
  struct variable {
    std::mutex mutex;
    tensor value;  // undefined until the first assignment (or initialization)
  };

  /// The variable called `name`, created (uninitialized) on first use. The reference stays
  /// valid as long as the store.
  variable& get(const std::string& name);
  /// The variable, or nullptr when it was never created.
  [[nodiscard]] variable* find(const std::string& name);
  /// Names of every variable, sorted.
  [[nodiscard]] std::vector<std::string> names() const;
  /// Drops every value (their buffers go back to their pools).
  void clear();

 private:
  mutable std::mutex mutex_;
  std::unordered_map<std::string, std::unique_ptr<variable>> variables_;
};

}  // namespace loom
