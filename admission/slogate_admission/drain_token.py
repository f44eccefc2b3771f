"""The credential of the drain hook, shared by the operator (which writes it into the hook)
and the sidecar (which checks it).

The kubelet runs a preStop ``httpGet`` with the headers written in the pod spec and no other
credential; it cannot read a Secret. So the header carries a token derived from the admin
token (HMAC-SHA256, a fixed label): a pod-spec reader learns the drain token, never the admin
token that pushes thresholds. Without it any pod that reaches the admin port could drain any
gated pod, again and again (the second review).
"""

from __future__ import annotations

import hashlib
import hmac

HEADER = "X-Slogate-Drain-Token"
_LABEL = b"slogate drain hook v1"


def drain_token(admin_token: bytes) -> str:
    """The drain hook's token for this admin token (64 hex digits)."""
    return hmac.new(admin_token.strip(), _LABEL, hashlib.sha256).hexdigest()


def drain_allowed(admin_token: bytes, offered: bytes) -> bool:
    """``offered`` is this admin token's drain token (compared in constant time)."""
    expected = drain_token(admin_token).encode()
    return hmac.compare_digest(hashlib.sha256(offered).digest(), hashlib.sha256(expected).digest())
