#!/usr/bin/python3
"""Writes reference.safetensors, the independent reference file of
tests/checkpoint/safetensors_test.cpp.

Written from the format's description (8-byte little-endian header length, a JSON header,
then the data) with json, struct and NumPy only: the `safetensors` package is not
installed here. Each tensor's values follow a formula that the test computes again in C++.
The data is laid out in the reverse of the header's order, so a reader must follow
data_offsets rather than assume packing in header order.

Run with /usr/bin/python3 (it has NumPy) from anywhere:
    /usr/bin/python3 tests/data/safetensors/make_reference.py
"""
import json
import os
import struct

import numpy as np


def bf16_bits(values):
    # bfloat16 is the top half of a float32; these values are exact in bfloat16.
    f = np.asarray(values, dtype="<f4")
    bits = f.view("<u4") >> 16
    assert np.array_equal((bits << 16).view("<f4"), f), "value not exact in bfloat16"
    return bits.astype("<u2")


# (name, safetensors dtype, shape, little-endian data as a NumPy array)
TENSORS = [
    # i * 0.5 - 1 for i in 0..5
    ("f32_2x3", "F32", [2, 3], (np.arange(6, dtype="<f4") * np.float32(0.5) - np.float32(1)).reshape(2, 3)),
    # i / 3 for i in 0..3 (float64 division, as in C++)
    ("f64_4", "F64", [4], np.arange(4, dtype="<f8") / 3.0),
    # (i - 2) * 0.25 for i in 0..4, exact in float16
    ("f16_5", "F16", [5], ((np.arange(5) - 2) * 0.25).astype("<f2")),
    ("bf16_3", "BF16", [3], bf16_bits([1.0, -2.5, 3.140625])),
    ("i64_3", "I64", [3], np.array([-(2**40), 0, 2**40 + 7], dtype="<i8")),
    # -3 * i for i in 0..3
    ("i32_2x2", "I32", [2, 2], (np.arange(4, dtype="<i4") * -3).reshape(2, 2)),
    ("i8_4", "I8", [4], np.array([-128, -1, 0, 127], dtype="i1")),
    ("u8_3", "U8", [3], np.array([0, 128, 255], dtype="u1")),
    ("bool_4", "BOOL", [4], np.array([True, False, False, True], dtype="?")),
    ("scalar_f32", "F32", [], np.array(3.5, dtype="<f4")),
    ("empty_0x2", "F32", [0, 2], np.zeros((0, 2), dtype="<f4")),
    # 100 + i for i in 0..23, rank 3
    ("i32_2x3x4", "I32", [2, 3, 4], (np.arange(24, dtype="<i4") + 100).reshape(2, 3, 4)),
]
METADATA = {"format": "pt", "source": "make_reference.py"}


def main():
    header = {"__metadata__": METADATA}
    data = b""
    offsets = {}
    for name, _, _, values in reversed(TENSORS):
        raw = values.tobytes(order="C")
        offsets[name] = [len(data), len(data) + len(raw)]
        data += raw
    for name, dtype, shape, values in TENSORS:
        assert list(values.shape) == shape, name
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": offsets[name]}
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reference.safetensors")
    with open(out, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        f.write(data)
    print(f"wrote {out}: {8 + len(text) + len(data)} bytes, {len(TENSORS)} tensors")


if __name__ == "__main__":
    main()
