"""Minimal safetensors reader and writer (conventions.md section 5.1), torch + stdlib only.

Layout: u64 LE header length N, N bytes of UTF-8 JSON (right-padded with spaces), then the byte buffer.
Each header entry is {"dtype", "shape", "data_offsets": [begin, end)} relative to the buffer; the optional
"__metadata__" maps strings to strings. The reader checks that the entries cover the buffer exactly.
"""

import json
import os
import struct
import sys

import torch

if sys.byteorder != "little":
    raise RuntimeError("safetensors_io assumes a little-endian host")

# safetensors dtype name -> (torch dtype, bytes per element)
DTYPES = {
    "BOOL": (torch.bool, 1),
    "U8": (torch.uint8, 1),
    "I8": (torch.int8, 1),
    "I16": (torch.int16, 2),
    "U16": (None, 2),  # torch 1.13 has no uint16: widened to int32 on read
    "I32": (torch.int32, 4),
    "I64": (torch.int64, 8),
    "F16": (torch.float16, 2),
    "BF16": (torch.bfloat16, 2),
    "F32": (torch.float32, 4),
    "F64": (torch.float64, 8),
}
TORCH_TO_NAME = {v[0]: k for k, v in DTYPES.items() if v[0] is not None}
MAX_HEADER = 100_000_000


class SafetensorsError(ValueError):
    pass


def _numel(shape):
    n = 1
    for s in shape:
        n *= int(s)
    return n


def read_safetensors(path):
    """Returns (tensors, metadata): a dict name -> torch.Tensor (owning, contiguous) and the metadata dict."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise SafetensorsError(f"{path}: file is {len(data)} bytes, shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", data[:8])
    if n > MAX_HEADER or 8 + n > len(data):
        raise SafetensorsError(f"{path}: header length {n} does not fit the file ({len(data)} bytes)")
    try:
        header = json.loads(data[8 : 8 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SafetensorsError(f"{path}: header is not UTF-8 JSON: {e}") from e
    if not isinstance(header, dict):
        raise SafetensorsError(f"{path}: header is not a JSON object")
    metadata = header.pop("__metadata__", {}) or {}
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise SafetensorsError(f"{path}: __metadata__ must map strings to strings")
    buf = memoryview(data)[8 + n :]

    tensors = {}
    spans = []
    for name, entry in header.items():
        dtype_name = entry.get("dtype")
        if dtype_name not in DTYPES:
            raise SafetensorsError(f"{path}: tensor {name!r} has unsupported dtype {dtype_name!r}")
        torch_dtype, width = DTYPES[dtype_name]
        shape = [int(s) for s in entry["shape"]]
        begin, end = (int(x) for x in entry["data_offsets"])
        if not (0 <= begin <= end <= len(buf)):
            raise SafetensorsError(f"{path}: tensor {name!r} offsets [{begin}, {end}) outside buffer of {len(buf)}")
        if end - begin != _numel(shape) * width:
            raise SafetensorsError(
                f"{path}: tensor {name!r} spans {end - begin} bytes but shape {shape} x {dtype_name} needs "
                f"{_numel(shape) * width}")
        spans.append((begin, end, name))
        raw = bytearray(buf[begin:end])
        if not raw:
            t = torch.empty(0, dtype=torch_dtype or torch.int32)
        elif dtype_name == "U16":
            t = torch.frombuffer(raw, dtype=torch.int16).to(torch.int32) & 0xFFFF
        else:
            t = torch.frombuffer(raw, dtype=torch_dtype)
        tensors[name] = t.reshape(shape)

    spans.sort()
    pos = 0
    for begin, end, name in spans:
        if begin != pos:
            kind = "overlaps the previous tensor" if begin < pos else f"leaves a hole at byte {pos}"
            raise SafetensorsError(f"{path}: tensor {name!r} at [{begin}, {end}) {kind}")
        pos = end
    if pos != len(buf):
        raise SafetensorsError(f"{path}: tensors cover {pos} bytes of a {len(buf)}-byte buffer")
    return tensors, metadata


def write_safetensors(path, tensors, metadata=None):
    """Writes tensors (name -> torch.Tensor) the way moetrain does: tensors ordered by element size
    (descending) then name, header padded with spaces so that 8 + N is a multiple of 8."""
    items = []
    for name, t in tensors.items():
        if t.dtype not in TORCH_TO_NAME:
            raise SafetensorsError(f"tensor {name!r}: dtype {t.dtype} has no safetensors name")
        items.append((name, t.detach().contiguous().cpu()))
    items.sort(key=lambda kv: (-kv[1].element_size(), kv[0]))
    header = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    offset = 0
    blobs = []
    for name, t in items:
        raw = t.numpy().tobytes() if t.dtype != torch.bfloat16 else t.view(torch.int16).numpy().tobytes()
        header[name] = {"dtype": TORCH_TO_NAME[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        blobs.append(raw)
    hbytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hbytes += b" " * ((-(8 + len(hbytes))) % 8)
    tmp = str(path) + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hbytes)))
        f.write(hbytes)
        for raw in blobs:
            f.write(raw)
    os.replace(tmp, path)
