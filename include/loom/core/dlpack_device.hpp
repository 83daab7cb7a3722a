// Conversion between loom::device_id and DLPack's DLDevice.
//
// device_type's values are DLPack's DLDeviceType codes, so the conversion is lossless both
// ways for every type DLPack 0.6 defines (the installed <dlpack/dlpack.h>): from_dlpack
// (to_dlpack(d)) == d and to_dlpack(from_dlpack(x)) == x.
#pragma once

#include <dlpack/dlpack.h>

#include "loom/core/device_id.hpp"

namespace loom {

/// The DLDevice for `d`. Throws loom::invalid_argument when d.type is no device_type value
/// or d.index is negative (neither can come from parse_device_id or from_dlpack).
[[nodiscard]] DLDevice to_dlpack(device_id d);

/// The device_id for `d`. Throws loom::invalid_argument for a device type code DLPack 0.6
/// does not define or a negative device_id. Reads the type code as an integer, so a
/// DLDevice filled in by C code with any code is safe to pass.
[[nodiscard]] device_id from_dlpack(const DLDevice& d);

}  // namespace loom
