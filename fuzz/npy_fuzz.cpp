// libFuzzer target: parse_npy on arbitrary bytes.
//
// Any input must either read, or be refused with a loom::error (or std::bad_alloc). A
// tensor that reads is contiguous, and to_npy of it reads back to the same dtype, shape and
// bytes (a bool tensor holds only 0 and 1).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <span>

#include "loom/core/error.hpp"
#include "loom/memory/npy.hpp"

namespace {

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "npy_fuzz: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  loom::tensor t;
  try {
    t = loom::memory::parse_npy(bytes);
  } catch (const loom::error&) {
    return 0;
  } catch (const std::bad_alloc&) {
    return 0;
  }
  if (!t.defined() || !t.is_contiguous()) fail("parse_npy returned a non-contiguous tensor");
  if (t.nbytes() > size) fail("more bytes of data than the input holds");
  if (t.type() == loom::dtype::boolean) {
    const auto* p = static_cast<const unsigned char*>(t.raw_data());
    for (std::size_t i = 0; i < t.nbytes(); ++i) {
      if (p[i] > 1) fail("a bool element is neither 0 nor 1");
    }
  }
  try {
    const auto image = loom::memory::to_npy(t);
    const loom::tensor back = loom::memory::parse_npy(image);
    if (back.type() != t.type() || back.shape() != t.shape()) fail("round trip changed the type");
    if (t.nbytes() != 0 && std::memcmp(back.raw_data(), t.raw_data(), t.nbytes()) != 0) {
      fail("round trip changed the data");
    }
  } catch (const loom::error&) {
    fail("to_npy wrote what parse_npy refuses");
  }
  return 0;
}
