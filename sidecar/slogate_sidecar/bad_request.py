"""The one exception a request body the gate refuses raises, and the helpers that phrase it.

Raised wherever the problem is found (reading the body: ``body.read_body``; parsing it:
``requests``; a rule of the gate's own), it is answered by the error middleware
(``app.json_errors``). Every refusal names the offending field (``param``) when there is
one and what was expected, in the OpenAI error shape, so existing clients show the message as is.
"""

from __future__ import annotations

from typing import Any, NoReturn


class BadRequest(Exception):  # noqa: N818 - the name is the HTTP status it becomes
    """A body the gate refuses before deciding; ``body()`` is the client's error object."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        """The OpenAI-style error object, so existing clients show the message."""
        return {
            "error": {
                "message": self.message,
                "type": "invalid_request_error",
                "param": self.param,
                "code": self.code,
            }
        }


def json_type(value: object) -> str:
    """The JSON name of a value's type, for error messages."""
    names = {bool: "boolean", int: "integer", float: "number", str: "string"}
    names |= {list: "array", dict: "object", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def wrong_type(param: str, expected: str, value: object) -> NoReturn:
    """``param`` has the wrong JSON type."""
    message = f"'{param}' must be {expected}, got {json_type(value)}"
    raise BadRequest(message, param=param, code="invalid_type")


def invalid(param: str, message: str, *, code: str = "invalid_value") -> NoReturn:
    """``param`` has the right type but a value the gate refuses."""
    raise BadRequest(message, param=param, code=code)


def missing(param: str, expected: str) -> NoReturn:
    """A required ``param`` is absent."""
    message = f"'{param}' is required: {expected}"
    raise BadRequest(message, param=param, code="missing_required_parameter")
