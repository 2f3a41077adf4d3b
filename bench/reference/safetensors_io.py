"""Pure-Python safetensors reading and writing for torch tensors.

The safetensors package is not installed on the machines we bench on (Debian's python3-torch
has no wheel extras), and the format is simple enough to do with struct + json:

    [8 bytes: little-endian u64 N][N bytes: JSON header][data bytes]

The header maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]} with offsets
relative to the start of the data bytes, plus an optional "__metadata__" map of strings. We write
tensors in the order given (so a file of parameters keeps registration order), pad the header with
spaces to a multiple of 8 bytes (as the reference implementation does, so that data is aligned),
and read tensors back in data-offset order.

Only little-endian hosts are supported (the format is little-endian; so is every machine we use).
"""

import collections
import ctypes
import json
import struct
import sys

import torch

# safetensors dtype strings <-> torch dtypes, the subset this project uses.
_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
_NAMES = {dtype: name for name, dtype in _DTYPES.items()}

# A header larger than this is certainly not a safetensors file (the reference reader uses the
# same 100 MB bound), so a wrong file gives an error rather than a huge allocation.
_MAX_HEADER = 100_000_000

assert sys.byteorder == "little", "safetensors_io: big-endian hosts are not supported"


def _tensor_bytes(tensor):
    """The raw bytes of a CPU tensor, without numpy (which has no bfloat16)."""
    t = tensor.detach().to("cpu").contiguous()
    nbytes = t.numel() * t.element_size()
    if nbytes == 0:
        return b""
    return ctypes.string_at(t.data_ptr(), nbytes)


def save_file(tensors, path, metadata=None):
    """Writes `tensors` (a mapping name -> tensor, in the order to keep) to `path`.

    Tensors may live on any device; they are copied to the CPU. Names must be unique strings and
    must not be "__metadata__". `metadata`, if given, is a str -> str mapping stored in the header.
    """
    header = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    blobs = []
    offset = 0
    for name, tensor in tensors.items():
        if name == "__metadata__":
            raise ValueError("safetensors_io.save_file: '__metadata__' is reserved, not a tensor name")
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"safetensors_io.save_file: '{name}' is a {type(tensor).__name__}, not a tensor")
        if tensor.dtype not in _NAMES:
            raise ValueError(
                f"safetensors_io.save_file: '{name}' has dtype {tensor.dtype}; supported: "
                + ", ".join(str(d) for d in _NAMES)
            )
        blob = _tensor_bytes(tensor)
        header[name] = {
            "dtype": _NAMES[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + len(blob)],
        }
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


def _read_header(data, path):
    if len(data) < 8:
        raise ValueError(f"safetensors_io: {path} is {len(data)} bytes, too short for a safetensors file")
    (n,) = struct.unpack("<Q", data[:8])
    if n > _MAX_HEADER or 8 + n > len(data):
        raise ValueError(
            f"safetensors_io: {path} declares a {n}-byte header in a {len(data)}-byte file; "
            "not a safetensors file or truncated"
        )
    try:
        header = json.loads(data[8 : 8 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"safetensors_io: {path}: header is not JSON ({e})") from None
    return header, 8 + n


def load_file(path, device="cpu"):
    """Reads `path` into an OrderedDict name -> tensor, in the file's data order.

    Each tensor has its own memory (none aliases another or the file's bytes).
    """
    with open(path, "rb") as f:
        data = bytearray(f.read())
    header, start = _read_header(data, path)
    header.pop("__metadata__", None)
    entries = sorted(header.items(), key=lambda kv: (kv[1]["data_offsets"][0], kv[0]))
    out = collections.OrderedDict()
    for name, info in entries:
        dtype_name = info.get("dtype")
        if dtype_name not in _DTYPES:
            raise ValueError(
                f"safetensors_io: {path}: tensor '{name}' has dtype {dtype_name}; "
                "supported: " + ", ".join(_DTYPES)
            )
        dtype = _DTYPES[dtype_name]
        shape = [int(s) for s in info["shape"]]
        begin, end = (int(o) for o in info["data_offsets"])
        numel = 1
        for s in shape:
            numel *= s
        itemsize = torch.empty((), dtype=dtype).element_size()
        if end - begin != numel * itemsize or start + end > len(data) or begin > end:
            raise ValueError(
                f"safetensors_io: {path}: tensor '{name}' {dtype_name}{shape} needs "
                f"{numel * itemsize} bytes but has data_offsets [{begin}, {end}] "
                f"(file data is {len(data) - start} bytes)"
            )
        if numel == 0:
            tensor = torch.empty(shape, dtype=dtype)
        else:
            # A fresh (malloc-aligned) copy per tensor, which the tensor keeps alive: no tensor
            # aliases another, and none depends on the writer having aligned its data.
            chunk = data[start + begin : start + end]
            tensor = torch.frombuffer(chunk, dtype=dtype).reshape(shape)
        out[name] = tensor.to(device) if device != "cpu" else tensor
    return out


def load_metadata(path):
    """The "__metadata__" map of `path` (empty if none)."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError(f"safetensors_io: {path} is too short for a safetensors file")
        (n,) = struct.unpack("<Q", head)
        if n > _MAX_HEADER:
            raise ValueError(f"safetensors_io: {path} declares a {n}-byte header; not a safetensors file")
        data = head + f.read(n)
    header, _ = _read_header(data, path)
    return dict(header.get("__metadata__", {}))
