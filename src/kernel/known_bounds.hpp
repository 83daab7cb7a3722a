// What a kernel has proven of the values it wrote, for the kernel that reads them next.
//
// Note [known bounds]
// A convolution whose clip ran inside oneDNN's primitive proved, for every chunk, that no sum
// can be NaN (Note [bias and clip in the primitive] in src/backends/cpu/nn_conv.cpp): so every
// value it wrote is finite and within the clip's bounds. It records that against its output's
// buffer, and a convolution that reads that output (a depthwise layer after an expansion) makes
// its own proof from the bound instead of reading its input. The record is kept here, by
// buffer, not in the tensor: the tensor is in every file of loom, and this concerns two kernels.
// - A convolution records against its output's buffer every time it writes one: the bound, or
//   nothing known (which erases an older record of a buffer at the same address).
// - A kernel trusts a record only for an input that comes straight from a convolution node of
//   the graph it runs in: that node has just written the record for that buffer, and the
//   buffer, held by the input slot, cannot have been freed and its address reused since;
//   nothing else writes into it meanwhile (a node writes over an input's buffer only when it
//   alone holds it). A fed endpoint reaches its readers from the plan's feed, not from the
//   convolution, and a variable's value (updated in place) from the variable's read: neither
//   is trusted (ConvBiasInSum.AFedTensorIsNotTrustedForWhatItsConvolutionProved feeds back a
//   convolution's output, fetched and changed).
// - At most `capacity` records are kept (records of freed buffers linger until their address
//   is written again); past it they are all dropped, which only forgets.
#pragma once

#include "loom/core/buffer.hpp"

namespace loom::known_bounds {

/// Records that every element `b` holds, as just written, is finite and at most `bound` in
/// magnitude; `bound` +inf (or NaN) records that nothing is known.
void record(const buffer* b, float bound);
/// The bound recorded for `b`; +inf when none.
[[nodiscard]] float of(const buffer* b);

}  // namespace loom::known_bounds
