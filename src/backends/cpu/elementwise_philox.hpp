// Philox4x32-10: the counter-based random number generator of Salmon et al., "Parallel
// random numbers: as easy as 1, 2, 3" (SC'11), as in Random123, cuRAND, TensorFlow and JAX.
//
// A pure function of a 128-bit counter and a 64-bit key: block `i` of a stream is
// philox(counter = i, key = seed), so any thread can compute any part of the stream without
// the parts before it. That is what makes loom's random ops give the same values whatever
// the number of threads (Note [reproducible random numbers] in elementwise_generators.cpp).
#pragma once

#include <array>
#include <cstdint>

namespace loom::cpu::ew {

/// Four 32-bit words.
using philox_block = std::array<std::uint32_t, 4>;

/// Philox4x32 with 10 rounds of `counter` under `key`. Pure; thread-safe.
constexpr philox_block philox4x32_10(philox_block counter, std::array<std::uint32_t, 2> key) {
  constexpr std::uint32_t m0 = 0xD2511F53u;
  constexpr std::uint32_t m1 = 0xCD9E8D57u;
  constexpr std::uint32_t w0 = 0x9E3779B9u;  // golden ratio
  constexpr std::uint32_t w1 = 0xBB67AE85u;  // sqrt(3) - 1
  for (int round = 0; round < 10; ++round) {
    const std::uint64_t p0 = std::uint64_t{m0} * counter[0];
    const std::uint64_t p1 = std::uint64_t{m1} * counter[2];
    const auto hi0 = static_cast<std::uint32_t>(p0 >> 32);
    const auto lo0 = static_cast<std::uint32_t>(p0);
    const auto hi1 = static_cast<std::uint32_t>(p1 >> 32);
    const auto lo1 = static_cast<std::uint32_t>(p1);
    counter = {hi1 ^ counter[1] ^ key[0], lo1, hi0 ^ counter[3] ^ key[1], lo0};
    key[0] += w0;
    key[1] += w1;
  }
  return counter;
}

/// Block `index` of stream `stream` of `seed`: counter (index, stream) with the seed as the
/// key. Stream 0 is random_uniform's and random_normal's; the per-run ops draw stream k on
/// their run k.
constexpr philox_block philox_at(std::uint64_t seed, std::uint64_t index, std::uint64_t stream = 0) {
  return philox4x32_10(
      {static_cast<std::uint32_t>(index), static_cast<std::uint32_t>(index >> 32),
       static_cast<std::uint32_t>(stream), static_cast<std::uint32_t>(stream >> 32)},
      {static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)});
}

/// A float in [0, 1) from the top 24 bits of `bits` (every value a multiple of 2^-24).
constexpr float uniform_float(std::uint32_t bits) {
  return static_cast<float>(bits >> 8) * 0x1.0p-24f;
}
/// A double in [0, 1) from the top 53 bits of hi:lo.
constexpr double uniform_double(std::uint32_t hi, std::uint32_t lo) {
  const std::uint64_t b = (std::uint64_t{hi} << 32) | lo;
  return static_cast<double>(b >> 11) * 0x1.0p-53;
}

}  // namespace loom::cpu::ew
