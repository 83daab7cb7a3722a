// NumPy .npy files: tensors to and from NumPy's array file format.
//
// Note [npy format]
// A .npy file is the magic "\x93NUMPY", a version (major, minor byte), the length of the
// header (2 bytes little-endian in version 1.0, 4 bytes in 2.0 and 3.0), the header (a
// Python dict literal, ASCII in 1.0/2.0 and UTF-8 in 3.0, padded with spaces and ended by
// '\n'), then the elements:
//
//   {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
//
// loom reads versions 1.0, 2.0 and 3.0 with the dtypes '<f4' '<f8' '<f2' '<i4' '<i8' '|i1'
// '|u1' '|b1' (also '?'; single-byte types with any byte-order mark), little-endian only,
// in C order or Fortran order (read into a C-order tensor). It writes version 1.0 (2.0 when
// the header needs it), C order, the header padded so that the data starts at a multiple
// of 64 bytes, as NumPy does. bfloat16 is not a NumPy type and is refused: cast to float32
// first.
//
// Reading is strict: the bytes after the header must be exactly the elements (no more, no
// fewer), bool elements must be 0 or 1, and every key of the header must be there once and
// no other. Any fault is a loom::parse_error (line 0) saying what is wrong.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "loom/core/tensor.hpp"

namespace loom::memory {

/// NumPy's type string of `t` ("<f4", "|b1": the .npy descr and the array interface's
/// typestr), or nullptr for bfloat16, which NumPy lacks.
[[nodiscard]] const char* numpy_typestr(dtype t) noexcept;

/// The tensor in the .npy file at `path`, in a new contiguous host tensor (cpu:0's
/// resource). Throws loom::not_found when the file cannot be opened, loom::error when
/// reading fails, loom::parse_error (naming the file) for a malformed or unsupported file
/// (Note [npy format]), loom::out_of_memory as the allocation does.
[[nodiscard]] tensor read_npy(const std::string& path);

/// The tensor in the .npy image `bytes` (a whole file), in a new contiguous host tensor.
/// Throws as read_npy.
[[nodiscard]] tensor parse_npy(std::span<const std::byte> bytes);

/// Writes `t` (any strides, in host-accessible memory) to `path` as a .npy file, replacing
/// it. Throws loom::invalid_argument for an undefined tensor, a bfloat16 tensor (not a
/// NumPy type: cast it to float32 first) or one in memory the CPU cannot read; loom::error
/// when the file cannot be written.
void write_npy(const tensor& t, const std::string& path);

/// `t` as the bytes of a .npy file. Throws as write_npy.
[[nodiscard]] std::vector<std::byte> to_npy(const tensor& t);

}  // namespace loom::memory
