"""What a request that cannot be served gets: an HTTP status and OpenAI's error object, and the check every
text field shares."""

from __future__ import annotations

from typing import Any


class RequestError(Exception):
    """A request that cannot be served as sent: an HTTP status and OpenAI's error fields."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None, status: int = 400,
                 kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.message, self.param, self.code, self.status, self.kind = message, param, code, status, kind

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.kind, self.param, self.code)


def error_body(message: str, kind: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def unicode_text(text: str, param: str) -> str:
    """`text`, which JSON's \\u escapes may have given a lone surrogate (half of a UTF-16 pair): no UTF-8 text
    can hold one, so no tokenizer can take it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise RequestError(f"{param} is not valid Unicode: it holds a lone surrogate, \\u{ord(text[exc.start]):04x}",
                           param=param) from None
    return text
