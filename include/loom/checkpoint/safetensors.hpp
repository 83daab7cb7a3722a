// safetensors: named tensors to and from Hugging Face's safetensors file format.
//
// Note [safetensors format]
// A safetensors file is
//
//   N             8 bytes, little-endian unsigned: the length of the header
//   header        N bytes of UTF-8 JSON, an object:
//                   {"__metadata__": {"format": "loom"},
//                    "w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}, ...}
//   data          the elements of every tensor, row-major, little-endian; a tensor's
//                 data_offsets [begin, end) count from the first byte after the header
//
// dtypes F64 F32 F16 BF16 I64 I32 I8 U8 BOOL are loom's float64 float32 float16 bfloat16
// int64 int32 int8 uint8 bool; the format's other dtypes (F8_E4M3, U16, ...) are refused,
// naming the tensor and the dtype. "__metadata__" (optional) maps strings to strings.
//
// Reading is strict, so that a damaged file fails loudly instead of loading garbage: the
// header must be JSON that is exactly this (no key twice at any level, no other keys in a
// tensor's entry, every field of the right type), shapes non-negative with a byte count that
// fits in 64 bits, every tensor's range inside the data with end - begin equal to its
// element count times its element size, no two tensors sharing a byte, bool elements 0 or
// 1. Gaps between tensors and bytes after the last one are allowed (the format does not
// forbid them; loom does not write them). Any fault is a loom::parse_error (line 0) naming
// the tensor and what is wrong. Tensors come back in header order.
//
// Writing puts "__metadata__" first (when there is any), then the tensors in the order
// given, their data packed in that order, and pads the header with spaces to a multiple of
// 8 bytes, as the reference implementation does, so the data starts 8-byte aligned.
//
// save_safetensors replaces its file atomically (Note [atomic file replacement] in
// src/checkpoint/safetensors.cpp): a reader, or a crash, sees the old file or the new one,
// never a mixture.
#pragma once

#include <cstddef>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "loom/core/tensor.hpp"

namespace loom::checkpoint {

/// The contents of a safetensors file.
struct safetensors_file {
  /// The tensors, in header order; each a new contiguous host tensor (cpu:0's resource).
  std::vector<std::pair<std::string, tensor>> tensors;
  /// The "__metadata__" of the file (empty when it has none).
  std::map<std::string, std::string> metadata;
};

/// Parses the safetensors image `bytes` (a whole file; Note [safetensors format]). The
/// tensors are copied out, so `bytes` may go once this returns. Throws loom::parse_error,
/// its message starting with `what`, for anything malformed or unsupported: a header
/// length past the end, bad JSON, missing or ill-typed fields, an unknown dtype, a negative
/// or overflowing shape, offsets outside the data, a byte count that is not the element
/// count times the element size, overlapping tensors, duplicate names, a bool element that
/// is not 0 or 1. Throws loom::out_of_memory as the allocation does.
[[nodiscard]] safetensors_file parse_safetensors(std::span<const std::byte> bytes,
                                                 std::string_view what = "safetensors");

/// The safetensors image of `tensors` (any strides; written dense) with `metadata`.
/// Throws loom::invalid_argument, naming the tensor, for an undefined tensor, one in memory
/// the CPU cannot read, a name that is "__metadata__", not UTF-8, or given twice.
[[nodiscard]] std::vector<std::byte> to_safetensors(
    const std::vector<std::pair<std::string, tensor>>& tensors,
    const std::map<std::string, std::string>& metadata = {});

/// Writes `tensors` and `metadata` to `path` as a safetensors file, atomically: the bytes
/// go to `path` + ".tmp-<16 hex digits>" in the same directory (locked while it is written),
/// which is flushed to disk (fsync), renamed over `path`, and the directory is flushed too.
/// On any failure `path` keeps its old contents (or stays absent) and the temporary file is
/// removed; temporary files that earlier saves of `path` left when their process was killed
/// are removed first (remove_stale_temporaries). The new file has the default permissions
/// (0666 less the umask), not the old file's. Throws as to_safetensors before anything is
/// written, and loom::error naming the path and the system's reason when a file operation
/// fails.
void save_safetensors(const std::filesystem::path& path,
                      const std::vector<std::pair<std::string, tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

/// Removes the temporary files of saves of `path` whose process died before the rename:
/// files in `path`'s directory named exactly `path`'s name + ".tmp-" + 16 lowercase hex
/// digits that no live save holds locked (Note [temporary file names] in
/// src/checkpoint/safetensors.cpp). Nothing else is touched. Returns the files removed;
/// best effort (a file that cannot be removed, or a directory that cannot be read, is left
/// as it is), never throws but std::bad_alloc.
std::vector<std::filesystem::path> remove_stale_temporaries(const std::filesystem::path& path);

/// Reads the safetensors file at `path`. Throws loom::not_found when it does not exist,
/// loom::invalid_argument when it is a directory or not a regular file (check_input_file),
/// loom::error naming the path and the reason when it cannot be read, and as
/// parse_safetensors (the message naming the path) when it is malformed.
[[nodiscard]] safetensors_file load_safetensors(const std::filesystem::path& path);

}  // namespace loom::checkpoint
