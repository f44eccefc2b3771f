"""KV-cache memory: the scarce resource of a continuous-batching server.

Spec: "LLM twist 2". A request occupies KV cells for its prompt and every token it
generates; admitting on optimistic memory math causes mid-generation eviction, the
most expensive failure. So the gate reserves the worst case up front.
"""

from __future__ import annotations

from slogate_admission._checks import require_non_negative, require_positive


def kv_bytes_per_token(n_layers: int, n_kv_heads: int, head_dim: int, bytes_per_element: float) -> float:
    """KV bytes per token = 2 · n_layers · n_kv_heads · d_head · bytes (2: one K and one V).

    32 layers, 8 KV heads, d_head 128, fp16 -> 131,072 B; SmolLM2-135M (30, 3, 64,
    f16) -> 23,040 B.
    """
    require_positive("n_layers", n_layers)
    require_positive("n_kv_heads", n_kv_heads)
    require_positive("head_dim", head_dim)
    require_positive("bytes_per_element", bytes_per_element)
    return 2.0 * n_layers * n_kv_heads * head_dim * bytes_per_element


def kv_reserved_tokens(prompt_tokens: int, reserved_output_tokens: int) -> int:
    """Tokens of KV a request reserves: n_in + n_out, with n_out the conservative estimate.

    Without preemption the worst case is n_out = max_tokens: KV(r) covers (n_in + n_out).
    """
    require_non_negative("prompt_tokens", prompt_tokens)
    require_non_negative("reserved_output_tokens", reserved_output_tokens)
    return prompt_tokens + reserved_output_tokens


def kv_request_bytes(prompt_tokens: int, reserved_output_tokens: int, bytes_per_token: float) -> float:
    """KV(r) = 2 · n_layers · n_kv_heads · d_head · (n_in + n_out) · bytes, via bytes/token."""
    require_positive("bytes_per_token", bytes_per_token)
    return kv_reserved_tokens(prompt_tokens, reserved_output_tokens) * bytes_per_token


def kv_gate(free: float, needed: float) -> bool:
    """The memory predicate: free_KV ≥ KV_reserved(r), both in one unit (bytes or tokens)."""
    require_non_negative("needed", needed)
    return free >= needed
