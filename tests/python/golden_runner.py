"""A device runner written from docs/golden-format.md alone — what a device team writes first.

It reads a case file (safetensors: 8-byte little-endian header length, JSON header, data), takes the descriptor
from the metadata and the input.* tensors, "runs the kernel" (here: numpy + ml_dtypes standing in for a device),
and writes a result file with the output.* tensors that `fp8ref diff CASE RESULT` judges.

    python3 golden_runner.py CASE.safetensors RESULT.safetensors
"""
import json
import struct
import sys

import ml_dtypes
import numpy as np

# safetensors dtype tag -> numpy dtype (FP8 and BF16 via ml_dtypes)
DTYPES = {
    "F32": np.float32, "F64": np.float64, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
    "F8_E4M3": ml_dtypes.float8_e4m3fn, "F8_E5M2": ml_dtypes.float8_e5m2,
    "F8_E4M3FNUZ": ml_dtypes.float8_e4m3fnuz, "F8_E5M2FNUZ": ml_dtypes.float8_e5m2fnuz,
    "F8_E8M0": ml_dtypes.float8_e8m0fnu, "U8": np.uint8, "I32": np.int32, "I64": np.int64,
}
TAGS = {np.dtype(v): k for k, v in DTYPES.items()}
FORMATS = {"e4m3fn": "F8_E4M3", "e5m2": "F8_E5M2", "e4m3fnuz": "F8_E4M3FNUZ", "e5m2fnuz": "F8_E5M2FNUZ",
           "ue8m0": "F8_E8M0", "f32": "F32", "f64": "F64", "f16": "F16", "bf16": "BF16"}


def read(path):
    """-> (tensors: name -> numpy array, metadata: dict)"""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    meta = header.pop("__metadata__", {})
    data = memoryview(blob)[8 + n:]
    tensors = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        arr = np.frombuffer(data[begin:end], dtype=DTYPES[info["dtype"]])
        tensors[name] = arr.reshape(info["shape"])
    return tensors, meta


def write(path, tensors, meta):
    header, chunks, offset = {"__metadata__": meta}, [], 0
    for name, arr in tensors.items():
        raw = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": TAGS[arr.dtype], "shape": list(arr.shape), "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-(8 + len(text)) % 8)  # data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(chunks))


def parse_descriptor(line):
    op, *pairs = line.split()
    return op, dict(p.split("=", 1) for p in pairs)


def run(case_path, result_path):
    tensors, meta = read(case_path)
    op, keys = parse_descriptor(meta["fp8ref.descriptor"])
    if op != "convert":
        raise SystemExit(f"this runner knows only 'convert', not {op!r}")
    # Every key not in the line takes its default (docs/golden-format.md, op convert).
    to = keys.get("to", "e4m3fn")
    x = tensors["input.x"]
    # The "device": ml_dtypes' astype, i.e. the ml_dtypes convention (f64 arrays round via f32).
    y = x.astype(DTYPES[FORMATS[to]])
    write(result_path, {"output.y": y}, {"fp8ref.backend": "python-ml_dtypes"})


if __name__ == "__main__":
    run(sys.argv[1], sys.argv[2])
