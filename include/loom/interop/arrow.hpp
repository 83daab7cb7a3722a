// The Arrow C Data Interface: loom tensors and tables to and from ArrowSchema/ArrowArray.
//
// The structs below are the Arrow specification's C definitions, copied as the
// specification asks (https://arrow.apache.org/docs/format/CDataInterface.html), guarded
// by ARROW_C_DATA_INTERFACE so that a translation unit that also includes Arrow's own
// abi.h (or nanoarrow) sees one definition.
//
// Note [arrow interop]
// What maps to what:
//   - a tensor is a primitive array of num_elements() values (any rank is flattened in
//     row-major order); a table is a struct array ("+s") with one child per column, which
//     is how Arrow exports a record batch;
//   - formats, both ways: "c" int8, "C" uint8, "i" int32, "l" int64, "e" float16,
//     "f" float32, "g" float64, "b" bool. Arrow's other fixed-width types ("s", "S", "I",
//     "L", dates, timestamps, decimals, ...) have no loom dtype and are refused on import;
//     bfloat16 has no Arrow type and is refused on export. Nested, variable-width and
//     dictionary-encoded arrays are refused, except the top-level struct of a table.
//
// Zero-copy and copies:
//   - export shares the tensor's memory: buffers[1] points at the tensor's first element,
//     and the array's private data holds a buffer_ptr to it until the array is released.
//     Copies: a non-contiguous tensor is first copied to a dense one (the export owns the
//     copy), and a bool tensor (one byte per value in loom) is packed into Arrow's bitmap;
//   - import shares the array's memory for every fixed-width column without nulls whose
//     data pointer is aligned to its element size: the tensor's buffer starts at the first
//     element (data + offset * size), and keeps the imported array alive. Copies: bool
//     columns (unpacked from bits to bytes) and misaligned data.
//
// Lifetime, as the specification's release rules say:
//   - export fills the caller's structs; the consumer calls release once (on the parent
//     only: a parent's release releases the children still in it). A consumer may move a
//     child out (copy the struct, set the original's release to NULL); the moved child owns
//     its memory and stays valid after the parent is released;
//   - import, on success, moves the ArrowArray into loom (the caller's array->release is set
//     to NULL) and releases the ArrowSchema (its release is called, and it sets release to
//     NULL, as the producer's callback must). The array's release runs exactly once, when
//     the last tensor sharing its memory is destroyed (for a table: when the last zero-copy
//     column goes), or at once when every column was copied. On error nothing is touched:
//     both structs still belong to the caller, who must release them.
//
// Errors: loom::invalid_argument, naming the column (or "the array" for a single tensor)
// and the format: nulls present (null_count > 0, or null_count == -1 with a zero bit in the
// validity bitmap), unsupported formats, dictionaries, wrong buffer or child counts,
// negative lengths or offsets, missing buffers, released or null structs, struct children
// shorter than the struct, bf16 and non-host tensors on export. Nothing throws across the C
// callbacks.
#pragma once

#include <stdint.h>  // NOLINT(modernize-deprecated-headers): the C definitions below use ::int64_t

#include <cstdint>

#include "loom/core/tensor.hpp"
#include "loom/interop/table.hpp"

extern "C" {

#ifndef ARROW_C_DATA_INTERFACE
#define ARROW_C_DATA_INTERFACE

#define ARROW_FLAG_DICTIONARY_ORDERED 1
#define ARROW_FLAG_NULLABLE 2
#define ARROW_FLAG_MAP_KEYS_SORTED 4

struct ArrowSchema {
  // Array type description
  const char* format;
  const char* name;
  const char* metadata;
  int64_t flags;
  int64_t n_children;
  struct ArrowSchema** children;
  struct ArrowSchema* dictionary;

  // Release callback
  void (*release)(struct ArrowSchema*);
  // Opaque producer-specific data
  void* private_data;
};

struct ArrowArray {
  // Array data description
  int64_t length;
  int64_t null_count;
  int64_t offset;
  int64_t n_buffers;
  int64_t n_children;
  const void** buffers;
  struct ArrowArray** children;
  struct ArrowArray* dictionary;

  // Release callback
  void (*release)(struct ArrowArray*);
  // Opaque producer-specific data
  void* private_data;
};

#endif  // ARROW_C_DATA_INTERFACE

}  // extern "C"

namespace loom::interop {

/// The Arrow format string of `t` ("f" for float32, ...; Note [arrow interop]). Throws
/// loom::invalid_argument for bfloat16, which Arrow has no type for.
[[nodiscard]] const char* arrow_format(dtype t);

/// Exports `t` as a primitive Arrow array of t.num_elements() values (row-major) with no
/// nulls, into `out_schema` and `out_array` (whatever they held is overwritten, not
/// released). Zero-copy for a contiguous tensor; a non-contiguous one is copied to dense
/// memory first, and bool is packed into bits (a copy). The schema's name is `name`.
/// Throws loom::invalid_argument for an undefined tensor, bfloat16, a tensor in memory the
/// CPU cannot read, or null out pointers; loom::out_of_memory when a copy cannot be made.
/// On throw the out structs are left untouched.
void export_tensor(const tensor& t, ArrowSchema* out_schema, ArrowArray* out_array,
                   const char* name = "");

/// Exports `t` (validated first) as a struct array ("+s") of t.num_rows() rows with one
/// child per column, named as the columns, each exported as export_tensor does. Throws as
/// export_tensor and table::validate, naming the column.
void export_table(const table& t, ArrowSchema* out_schema, ArrowArray* out_array);

/// Imports a primitive Arrow array (Note [arrow interop]) as a 1-D host tensor of
/// array->length elements, zero-copy where it can. On success it takes both structs (the
/// array is moved into the tensor's buffer, the schema is released); on throw both are left
/// as they were. Throws loom::invalid_argument for the faults Note [arrow interop] lists,
/// loom::out_of_memory when a copy cannot be made.
[[nodiscard]] tensor import_tensor(ArrowSchema* schema, ArrowArray* array);

/// Imports a struct array ("+s": a record batch) as a table, one column per child, named
/// by the children's schemas, honouring the struct's offset. Zero-copy columns share one
/// holder of the parent array, released when the last of them goes. Takes the structs on
/// success and leaves them on throw, as import_tensor. Throws as import_tensor, naming the
/// column, and for a top-level format other than "+s", nulls in the struct itself, a
/// mismatch between the schema's and the array's child counts, or a child shorter than
/// the struct's offset + length.
[[nodiscard]] table import_table(ArrowSchema* schema, ArrowArray* array);

}  // namespace loom::interop
