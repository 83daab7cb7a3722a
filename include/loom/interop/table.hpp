// table: named columns of equal length, what Arrow calls a record batch.
//
// A loom table is ordered columns, each a 1-D loom tensor, all of one length, each with a
// name. It is a plain aggregate: build it by pushing names and columns, then call
// validate() (export_table, columns_to_records and the importers do). The columns are
// ordinary tensors: copying a table shares their buffers.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "loom/core/tensor.hpp"

namespace loom::interop {

struct table {
  std::vector<std::string> names;
  std::vector<tensor> columns;

  /// Columns in the table.
  [[nodiscard]] std::size_t num_columns() const noexcept { return columns.size(); }
  /// The length of the columns (0 for a table without columns). Assumes a valid table.
  [[nodiscard]] std::int64_t num_rows() const noexcept {
    return columns.empty() ? 0 : columns.front().num_elements();
  }

  /// Appends a column. Does not validate (validate() does).
  void add(std::string name, tensor column) {
    names.push_back(std::move(name));
    columns.push_back(std::move(column));
  }

  /// The column called `name`. Throws loom::not_found, listing the names, when none is.
  [[nodiscard]] const tensor& column(std::string_view name) const;

  /// Checks that there are as many names as columns, every column is defined and 1-D,
  /// all have the same length, and the names are distinct. Throws loom::invalid_argument
  /// naming the column at fault.
  void validate() const;
};

}  // namespace loom::interop
