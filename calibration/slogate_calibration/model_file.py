"""What a GGUF file says about the model a server runs: geometry, quantization, identity.

A calibration profile is only valid for the model, quantization and server settings it
was measured with, and the KV-memory predicate needs the model's attention geometry. Both
come from the GGUF header, read with the llama.cpp project's own reader (PyPI `gguf`):
it memory-maps the file and parses metadata and tensor infos only, so the weights are
never read into memory.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, LlamaFileType

from slogate_admission.kv import kv_bytes_per_token
from slogate_admission.schema import ModelInfo

__all__ = [
    "CACHE_TYPES",
    "ModelFile",
    "ModelFileError",
    "cache_type_bytes_per_element",
    "fingerprint",
    "kv_bytes_per_token_for",
    "read_model_file",
]

_GGUF_MAGIC = b"GGUF"

# The values llama.cpp accepts for --cache-type-k / --cache-type-v, mapped to ggml types.
# Bytes per element are taken from gguf's GGML_QUANT_SIZES (block bytes / block size)
# rather than written down here, so they cannot drift from the format's definition:
# q8_0 is 34/32 (32 int8 values and an f16 scale), q4_0 18/32, and so on.
CACHE_TYPES: Mapping[str, GGMLQuantizationType] = {
    "f32": GGMLQuantizationType.F32,
    "f16": GGMLQuantizationType.F16,
    "bf16": GGMLQuantizationType.BF16,
    "q8_0": GGMLQuantizationType.Q8_0,
    "q4_0": GGMLQuantizationType.Q4_0,
    "q4_1": GGMLQuantizationType.Q4_1,
    "iq4_nl": GGMLQuantizationType.IQ4_NL,
    "q5_0": GGMLQuantizationType.Q5_0,
    "q5_1": GGMLQuantizationType.Q5_1,
}


class ModelFileError(ValueError):
    """The model file is missing, is not GGUF, is corrupt, or lacks a needed key."""


@dataclass(frozen=True)
class ModelFile:
    """The facts calibration and the KV predicate need from one GGUF file."""

    path: Path
    file_bytes: int
    name: str
    architecture: str
    quantization: str
    """Human name such as "Q4_1", from general.file_type (or the dominant weight type)."""
    n_layers: int
    n_kv_heads: int
    head_dim_k: int
    head_dim_v: int
    context_length: int
    """The context the model was trained for; the server may run with less."""
    header_bytes: int
    """Where tensor data starts: magic, metadata, tensor infos and alignment padding."""
    header_sha256: str
    """sha256 of bytes [0, header_bytes): magic, metadata and tensor infos.

    Identifies model and quantization (names, shapes, tensor types, tokenizer) without
    hashing the weights: two files with equal headers have the same geometry and the same
    kernels, hence the same speed, which is what a calibration profile depends on.
    """

    def to_model_info(self) -> ModelInfo:
        """The profile's model section (the schema has one head dimension: K's)."""
        return ModelInfo(
            name=self.name,
            quantization=self.quantization,
            n_layers=self.n_layers,
            n_kv_heads=self.n_kv_heads,
            head_dim=self.head_dim_k,
            file_bytes=self.file_bytes,
        )


def read_model_file(path: Path) -> ModelFile:
    """Read a GGUF file's header. Raises ModelFileError with a message naming the file."""
    path = Path(path)
    if not path.exists():
        raise ModelFileError(f"model file not found: {path}")
    if not path.is_file():
        raise ModelFileError(f"model path is not a regular file: {path}")
    try:
        with path.open("rb") as handle:
            magic = handle.read(len(_GGUF_MAGIC))
        file_bytes = path.stat().st_size
    except OSError as exc:
        raise ModelFileError(f"cannot read model file {path}: {exc}") from exc
    # Checked here because the reader's own errors for non-GGUF input are numpy internals
    # ("cannot mmap an empty file", dtype-size complaints) rather than a diagnosis.
    if magic != _GGUF_MAGIC:
        raise ModelFileError(f"{path} is not a GGUF file (it does not start with 'GGUF')")
    try:
        reader = GGUFReader(path, "r")
    # A truncated or damaged file surfaces as whatever numpy hit first (IndexError on a
    # short read, ValueError on a bad reshape or enum value, ...): report it as corrupt.
    except (ValueError, IndexError, KeyError, OverflowError) as exc:
        raise ModelFileError(f"{path} is not a readable GGUF file (truncated or corrupt?): {exc}") from exc
    return _model_file(path, file_bytes, reader)


def _model_file(path: Path, file_bytes: int, reader: GGUFReader) -> ModelFile:
    arch = _string(reader, path, "general.architecture")
    head_count = _int(reader, path, f"{arch}.attention.head_count")
    n_kv_heads = _optional_int(reader, path, f"{arch}.attention.head_count_kv") or head_count
    # llama.cpp's own defaults when key/value_length are absent: n_embd / n_head.
    embedding = _int(reader, path, f"{arch}.embedding_length")
    if embedding % head_count != 0:
        raise ModelFileError(
            f"{path}: {arch}.embedding_length {embedding} is not a multiple of "
            f"head_count {head_count}, and no attention.key_length says the head size"
        )
    head_dim_k = _optional_int(reader, path, f"{arch}.attention.key_length") or (embedding // head_count)
    head_dim_v = _optional_int(reader, path, f"{arch}.attention.value_length") or (embedding // head_count)
    data_offset = int(reader.data_offset)
    return ModelFile(
        path=path,
        file_bytes=file_bytes,
        name=_optional_string(reader, path, "general.name") or path.stem,
        architecture=arch,
        quantization=_quantization(reader),
        n_layers=_int(reader, path, f"{arch}.block_count"),
        n_kv_heads=n_kv_heads,
        head_dim_k=head_dim_k,
        head_dim_v=head_dim_v,
        context_length=_int(reader, path, f"{arch}.context_length"),
        header_bytes=data_offset,
        header_sha256=_sha256_prefix(path, data_offset),
    )


def _quantization(reader: GGUFReader) -> str:
    field = reader.get_field("general.file_type")
    if field is not None:
        try:
            file_type = LlamaFileType(field.contents())
        except ValueError:  # a value newer than this gguf release: fall back to the tensors
            file_type = LlamaFileType.GUESSED
        # GUESSED (1024) means the converter did not know either.
        if file_type is not LlamaFileType.GUESSED:
            return file_type.name.removeprefix("MOSTLY_").removeprefix("ALL_")
    # Older converters omit file_type: the most common type among matrices (ndim >= 2)
    # is the quantization; 1-D norms and biases are F32 in every quantization.
    matrices = Counter(t.tensor_type for t in reader.tensors if len(t.shape) >= 2)
    if not matrices:
        return "unknown"
    return matrices.most_common(1)[0][0].name


def _sha256_prefix(path: Path, length: int) -> str:
    digest = hashlib.sha256()
    remaining = length
    with path.open("rb") as handle:
        while remaining > 0:
            chunk = handle.read(min(remaining, 1 << 20))
            if not chunk:
                raise ModelFileError(f"{path} ends inside its own header (truncated?)")
            digest.update(chunk)
            remaining -= len(chunk)
    return digest.hexdigest()


def _value(reader: GGUFReader, key: str) -> object:
    field = reader.get_field(key)
    return None if field is None else field.contents()


def _optional_int(reader: GGUFReader, path: Path, key: str) -> int | None:
    value = _value(reader, key)
    # Some architectures store one head count per layer. The maximum over layers is the
    # conservative choice: the KV predicate must never under-reserve memory.
    if isinstance(value, list) and value and all(isinstance(v, int) for v in value):
        value = max(value)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ModelFileError(f"{path}: {key} should be a positive integer, got {value!r}")
    return value


def _int(reader: GGUFReader, path: Path, key: str) -> int:
    value = _optional_int(reader, path, key)
    if value is None:
        raise ModelFileError(f"{path}: GGUF metadata key {key!r} is missing")
    return value


def _optional_string(reader: GGUFReader, path: Path, key: str) -> str | None:
    value = _value(reader, key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ModelFileError(f"{path}: {key} should be a string, got {value!r}")
    return value


def _string(reader: GGUFReader, path: Path, key: str) -> str:
    value = _optional_string(reader, path, key)
    if value is None:
        raise ModelFileError(f"{path}: GGUF metadata key {key!r} is missing")
    return value


# --------------------------------------------------------------------------- KV bytes


def cache_type_bytes_per_element(cache_type: str) -> float:
    """Bytes per cached element for a llama.cpp cache type ("f16" -> 2.0, "q8_0" -> 1.0625)."""
    try:
        ggml_type = CACHE_TYPES[cache_type.lower()]
    except KeyError:
        raise ValueError(f"unknown KV cache type {cache_type!r}; llama.cpp knows {', '.join(CACHE_TYPES)}") from None
    block_size, block_bytes = GGML_QUANT_SIZES[ggml_type]
    return block_bytes / block_size


def _check_blocks(cache_type: str, head_dim: int, which: str) -> None:
    # llama.cpp refuses to start ("K cache type q8_0 with block size 32 does not divide
    # n_embd_head_k=48"), so a byte count for that combination would describe no server.
    block_size, _ = GGML_QUANT_SIZES[CACHE_TYPES[cache_type.lower()]]
    if head_dim % block_size != 0:
        raise ValueError(
            f"{which} cache type {cache_type} has blocks of {block_size} values, which do not "
            f"divide the head dimension {head_dim}; llama.cpp rejects this combination"
        )


def kv_bytes_per_token_for(model: ModelFile, cache_type_k: str = "f16", cache_type_v: str = "f16") -> float:
    """KV bytes one token occupies: n_layers · n_kv_heads · (d_k · E_k + d_v · E_v).

    When K and V have the same type and head size this is the core's 2·L·H·D·E, and the
    core's function computes it, so gate and calibration share one formula.
    """
    bytes_k = cache_type_bytes_per_element(cache_type_k)
    bytes_v = cache_type_bytes_per_element(cache_type_v)
    _check_blocks(cache_type_k, model.head_dim_k, "K")
    _check_blocks(cache_type_v, model.head_dim_v, "V")
    if bytes_k == bytes_v and model.head_dim_k == model.head_dim_v:
        return kv_bytes_per_token(model.n_layers, model.n_kv_heads, model.head_dim_k, bytes_k)
    per_head = model.head_dim_k * bytes_k + model.head_dim_v * bytes_v
    return float(model.n_layers * model.n_kv_heads * per_head)


# --------------------------------------------------------------------------- fingerprint

_MODEL_KEYS = ("model_header_sha256", "model_file_bytes", "quantization")


def _setting_text(key: str, value: str | int) -> str:
    # bool before int: True is an int, and "true" is what a reader of the profile expects.
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | str):
        return str(value)
    raise TypeError(f"setting {key!r} must be a string or an integer, got {value!r}")


def fingerprint(model: ModelFile, settings: Mapping[str, str | int | None]) -> tuple[str, dict[str, str]]:
    """Identify "this model + quantization on a server with these settings".

    `settings` are the server options that change speed or capacity: threads, slots,
    ctx_per_slot, batch_size, ubatch, cache_type_k/v, flash_attn, ... None means "not
    set" and is left out, so {"threads": None} and {} fingerprint alike. Values become
    strings (4 and "4" are the same setting). Returns the first 16 hex digits of the
    sha256 of the canonical JSON (sorted keys) and the inputs, for the profile's
    fingerprint_inputs. The path is not an input: the same file mounted elsewhere is
    the same model.
    """
    inputs = {
        "model_header_sha256": model.header_sha256,
        "model_file_bytes": str(model.file_bytes),
        "quantization": model.quantization,
    }
    for key, value in settings.items():
        if not key:
            raise ValueError("setting names must not be empty")
        if key in _MODEL_KEYS:
            raise ValueError(f"setting {key!r} collides with a model input of the fingerprint")
        if value is not None:
            inputs[key] = _setting_text(key, value)
    canonical = json.dumps(inputs, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    digest = hashlib.sha256(canonical.encode("ascii")).hexdigest()[:16]
    return digest, dict(sorted(inputs.items()))
