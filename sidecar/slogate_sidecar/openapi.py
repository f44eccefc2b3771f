"""The sidecar's OpenAPI description: ``openapi.yaml`` beside this module, served on the admin port."""

from __future__ import annotations

import functools
from importlib import resources

from aiohttp import web

OPENAPI_PATH = "/slogate/v1/openapi.yaml"


@functools.cache
def document_text() -> str:
    """The YAML document shipped in the package."""
    return resources.files(__package__).joinpath("openapi.yaml").read_text(encoding="utf-8")


async def get_openapi(_request: web.Request) -> web.Response:
    """GET /slogate/v1/openapi.yaml."""
    return web.Response(text=document_text(), content_type="application/yaml")
