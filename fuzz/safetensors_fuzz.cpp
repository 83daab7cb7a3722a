// libFuzzer target: parse_safetensors on arbitrary bytes.
//
// Any input must either parse, or be refused with a loom::error (or std::bad_alloc). What
// parses holds contiguous host tensors with no more data than the input, unique names, bool
// elements 0 or 1; and to_safetensors of it parses back to the same names, dtypes, shapes,
// bytes and metadata.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <set>
#include <span>
#include <string>

#include "loom/checkpoint/safetensors.hpp"
#include "loom/core/error.hpp"

namespace {

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "safetensors_fuzz: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  loom::checkpoint::safetensors_file f;
  try {
    f = loom::checkpoint::parse_safetensors(bytes);
  } catch (const loom::error&) {
    return 0;
  } catch (const std::bad_alloc&) {
    return 0;
  }
  std::size_t total = 0;
  std::set<std::string> names;
  for (const auto& [name, t] : f.tensors) {
    if (!t.defined() || !t.is_contiguous()) fail("a tensor is undefined or not contiguous");
    if (!names.insert(name).second) fail("a name appears twice");
    total += t.nbytes();
    if (t.type() == loom::dtype::boolean) {
      const auto* p = static_cast<const unsigned char*>(t.raw_data());
      for (std::size_t i = 0; i < t.nbytes(); ++i) {
        if (p[i] > 1) fail("a bool element is neither 0 nor 1");
      }
    }
  }
  if (total > size) fail("more bytes of data than the input holds");
  try {
    const auto image = loom::checkpoint::to_safetensors(f.tensors, f.metadata);
    const auto back = loom::checkpoint::parse_safetensors(image);
    if (back.metadata != f.metadata) fail("round trip changed the metadata");
    if (back.tensors.size() != f.tensors.size()) fail("round trip changed the tensor count");
    for (std::size_t i = 0; i < f.tensors.size(); ++i) {
      const auto& [n0, t0] = f.tensors[i];
      const auto& [n1, t1] = back.tensors[i];
      if (n0 != n1) fail("round trip changed a name or the order");
      if (t0.type() != t1.type() || t0.shape() != t1.shape()) fail("round trip changed a type");
      if (t0.nbytes() != 0 && std::memcmp(t0.raw_data(), t1.raw_data(), t0.nbytes()) != 0) {
        fail("round trip changed the data");
      }
    }
  } catch (const loom::error&) {
    fail("to_safetensors wrote what parse_safetensors refuses");
  }
  return 0;
}
