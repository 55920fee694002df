"""Images a chat sends as http(s) URLs, fetched only where the server allows it (`--allow-image-urls`), bounded in
bytes and in time: a slow or huge answer is refused, never waited on."""

from __future__ import annotations

import time
import urllib.error
import urllib.request

from spec_cli.errors import SpecError
from spec_cli.llama.vision import MAX_IMAGE_BYTES, Image, check_image
from spec_cli.server.errors import RequestError
from spec_cli.server.openai_api import ImageUrl

FETCH_LIMIT_S = 10.0  # for the whole answer, not per read
READ_BYTES = 1 << 16


def fetch(image: ImageUrl, limit_bytes: int = MAX_IMAGE_BYTES, limit_s: float = FETCH_LIMIT_S) -> Image:
    """The image at `image.url`; a RequestError (400) naming its part when it cannot be had within the limits or
    is not an image."""
    deadline = time.monotonic() + limit_s
    data = bytearray()
    try:
        with urllib.request.urlopen(image.url, timeout=limit_s) as response:  # noqa: S310 (http(s) only, checked)
            while chunk := response.read(READ_BYTES):
                data += chunk
                if len(data) > limit_bytes:
                    raise RequestError(f"{image.where}: the image at {image.url} is larger than "
                                       f"{limit_bytes >> 20} MiB", param=image.where)
                if time.monotonic() > deadline:
                    raise RequestError(f"{image.where}: fetching {image.url} took more than {limit_s:g} s",
                                       param=image.where)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise RequestError(f"{image.where}: cannot fetch {image.url}: {reason}", param=image.where) from None
    try:
        return check_image(Image(bytes(data), image.where))
    except SpecError as exc:
        raise RequestError(str(exc), param=image.where) from None
