"""The images of a chat request: OpenAI `image_url` parts, as `data:` URLs (decoded and checked at once) or http(s)
URLs, which are fetched only where the server allows it (`--allow-image-urls`), bounded in bytes and in time: a
slow or huge answer is refused, never waited on."""

from __future__ import annotations

import base64
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

from spec_cli.errors import SpecError
from spec_cli.llama.vision import MAX_IMAGE_BYTES, Image, check_image
from spec_cli.api.errors import RequestError

FETCH_LIMIT_S = 10.0  # for the whole answer, not per read
READ_BYTES = 1 << 16


@dataclass(frozen=True)
class ImageUrl:
    """An image part's http(s) URL, fetched (where the server allows it) before the request runs."""

    url: str
    where: str


def image_part(value: object, where: str) -> Image | ImageUrl:
    """An `image_url` part's image: a `data:` URL's (checked to be one), or an http(s) URL to fetch."""
    url = value.get("url") if isinstance(value, dict) else value
    if not isinstance(url, str):
        raise RequestError(f"{where} must be {{\"url\": \"data:image/png;base64,…\"}}", param=where)
    if url.startswith(("http://", "https://")):
        return ImageUrl(url, where)
    header, comma, payload = url.partition(",")
    if not url.startswith("data:") or not comma or not header.endswith(";base64"):
        raise RequestError(f"{where}: the url must be a base64 data: URL (data:image/png;base64,…) or an http(s) "
                           "URL", param=where)
    try:
        return _checked(base64.b64decode(payload, validate=True), where)
    except ValueError:
        raise RequestError(f"{where}: the data: URL is not valid base64", param=where) from None


def fetch(image: ImageUrl, limit_bytes: int = MAX_IMAGE_BYTES, limit_s: float = FETCH_LIMIT_S) -> Image:
    """The image at `image.url`; a RequestError (400) naming its part when it cannot be had within the limits or
    is not an image."""
    deadline = time.monotonic() + limit_s
    data = bytearray()
    try:
        with urllib.request.urlopen(image.url, timeout=limit_s) as response:  # http(s) only: `image_part`
            while chunk := response.read(READ_BYTES):
                data += chunk
                if len(data) > limit_bytes:
                    raise RequestError(f"{image.where}: the image at {image.url} is larger than {limit_bytes:,} "
                                       "bytes", param=image.where)
                if time.monotonic() > deadline:
                    raise RequestError(f"{image.where}: fetching {image.url} took more than {limit_s:g} s",
                                       param=image.where)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise RequestError(f"{image.where}: cannot fetch {image.url}: {reason}", param=image.where) from None
    return _checked(bytes(data), image.where)


def _checked(data: bytes, where: str) -> Image:
    try:
        return check_image(Image(data, where))
    except SpecError as exc:
        raise RequestError(str(exc), param=where) from None
