// Array of structs <-> struct of arrays: interleaved buffers and records to columns and back.
//
// Two shapes of "array of structs" come to loom from outside:
//   - an interleaved [N, k] buffer of one dtype (xyz points, RGBA pixels, stereo audio):
//     deinterleave splits it into k columns of N values, interleave joins them back;
//   - records of mixed types, what a NumPy structured array is (np.dtype([('t', '<f8'),
//     ('x', '<f4'), ('id', '<i4')]), packed, or with align=True padded as a C struct):
//     records_to_columns reads the fields named in a list of (name, dtype, byte offset)
//     into a table, columns_to_records writes a table's columns back into records.
//
// Note [layout loops]
// These are memory-bound copies; what matters is touching each byte once, in order. Values
// move as raw bits of their size (1, 2, 4 or 8 bytes), so every dtype shares four loops.
// A dense [N, k] with k = 2, 3, 4 or 8 runs loops with k fixed at compile time, which
// GCC vectorises into shuffles (k = 3 only for some element sizes); k = 2 copies one
// column at a time over a block in L1, measured faster here than writing both at once,
// while for k = 4 and 8 the single loop is faster. Other k and any strides go through row blocks of
// about 16 KiB: each column's run of a block is copied while the block sits in L1, so the source is
// read from memory once whatever k is. A column that is contiguous in the source (a transposed
// view) is a memcpy. Records go the same way: per block, one strided pass per field, unaligned
// loads and stores through memcpy. With a thread_pool the rows are split over its threads
// (parallel_for); without one everything runs on the caller.
//
// All inputs and outputs are host memory (the CPU must be able to read the tensors); new
// tensors come from cpu:0's pool. Errors are loom::invalid_argument naming what is wrong
// (the field, the column, the shape, the dtype); on error nothing is written.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "loom/core/tensor.hpp"
#include "loom/interop/table.hpp"

namespace loom {
class thread_pool;
}

namespace loom::interop {

/// One field of a record: its name (the column it becomes), dtype and byte offset in the
/// record. A NumPy structured dtype's `fields` dict gives exactly these.
struct field {
  std::string name;
  dtype type = dtype::f32;
  std::size_t offset = 0;
};

/// Splits `aos`, an [N, k] tensor of any dtype and any strides (a transposed or sliced view
/// is fine) in host memory, into k new contiguous 1-D tensors of N values: column j holds
/// aos[:, j]. Throws loom::invalid_argument for an undefined tensor, a rank other than 2,
/// or memory the CPU cannot read; loom::out_of_memory as allocation does.
[[nodiscard]] std::vector<tensor> deinterleave(const tensor& aos, thread_pool* pool = nullptr);

/// Joins k 1-D tensors of N values each (one dtype, any strides, host memory) into a new
/// contiguous [N, k] tensor whose column j is columns[j]. Throws loom::invalid_argument for
/// no columns, an undefined or non-1-D column, differing dtypes or lengths (naming the
/// column), or memory the CPU cannot read.
[[nodiscard]] tensor interleave(const std::vector<tensor>& columns, thread_pool* pool = nullptr);

/// Reads `n` records of `record_size` bytes at `data` into a table with one column per
/// field, in the order of `fields`, each a new contiguous tensor of the field's dtype.
/// Bytes no field covers (padding) are not read. Throws loom::invalid_argument for
/// n < 0, record_size 0, null data with n > 0, no fields, a field that ends past the
/// record, two fields that overlap, or two fields of one name.
[[nodiscard]] table records_to_columns(const void* data, std::int64_t n, std::size_t record_size,
                                       const std::vector<field>& fields,
                                       thread_pool* pool = nullptr);

/// Writes the columns of `columns` named by `fields` into columns.num_rows() records of
/// `record_size` bytes at `data` (which must hold that many). Bytes no field covers are
/// left as they were; columns no field names are ignored. Throws loom::invalid_argument
/// (before writing anything) for the faults records_to_columns refuses, an invalid table,
/// a field with no column of its name, a column whose dtype is not the field's, or a column
/// in memory the CPU cannot read.
void columns_to_records(const table& columns, void* data, std::size_t record_size,
                        const std::vector<field>& fields, thread_pool* pool = nullptr);

}  // namespace loom::interop
