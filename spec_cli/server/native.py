"""llama.cpp's own routes beside OpenAI's, in llama-server's shapes (its `tools/server/README.md`): what front ends
and scripts written against llama-server call to count tokens, turn ids back into text, render a chat's prompt and
read the server's settings and slots. Plain functions of a parsed body; `app` reads the body and answers."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from spec_cli import __version__
from spec_cli.api import openai_api
from spec_cli.api.errors import RequestError, unicode_text
from spec_cli.llama.model import Model
from spec_cli.server.service import Service


def tokenize(model: Model, body: object) -> dict[str, Any]:
    """`content`'s token ids, `add_special` (BOS) off and `parse_special` on by default as llama-server's; with
    `with_pieces`, each id with its piece: text where the piece is whole UTF-8, else its bytes."""
    fields = _fields(body)
    content = fields.get("content")
    if not isinstance(content, str):
        raise RequestError("'content' must be the text to tokenize", param="content")
    tokens = model.tokenize_bytes(unicode_text(content, "content").encode("utf-8"),
                                  _flag(fields, "add_special", False), _flag(fields, "parse_special", True))
    if not _flag(fields, "with_pieces", False):
        return {"tokens": tokens}
    return {"tokens": [{"id": token, "piece": _piece(model.piece(token, special=True))} for token in tokens]}


def detokenize(model: Model, body: object) -> dict[str, Any]:
    """The text of `tokens`, control tokens spelt as their own text (llama-server's `tokens_to_str`)."""
    tokens = _fields(body).get("tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise RequestError("'tokens' must be a list of token ids", param="tokens")
    outside = [t for t in tokens if not 0 <= t < model.n_vocab]
    if outside:
        raise RequestError(f"'tokens' holds {outside[0]}, outside the vocabulary (0 to {model.n_vocab - 1})",
                           param="tokens")
    text = b"".join(model.piece(token, special=True) for token in tokens)
    return {"content": text.decode("utf-8", errors="replace")}


def apply_template(service: Service, body: object) -> dict[str, Any]:
    """The prompt a chat's `messages` (and `tools`) become under the server's template, as `/v1/chat/completions`
    renders it before generating."""
    fields = _fields(body)
    request = openai_api.parse_chat({"messages": fields.get("messages"), "tools": fields.get("tools")})
    return {"prompt": service.chat_prompt(request).text}


def props(service: Service) -> dict[str, Any]:
    """The server's settings as llama-server's GET /props gives them: the generation defaults and context of a
    slot, the slots, the model's path, its chat template and whether it reads images."""
    pair = service.pair
    return {"default_generation_settings": _slot(service, 0, busy=False), "total_slots": service.parallel,
            "model_path": str(pair.target.path), "chat_template": service.template or pair.target.chat_template() or "",
            "modalities": {"vision": pair.vision is not None}, "build_info": f"spec-cli {__version__}",
            "is_sleeping": False}


def slots(service: Service) -> list[dict[str, Any]]:
    """Each slot as llama-server's GET /slots gives it: its id, context, whether it is generating, and its
    settings; spec-cli's own phase (`/health`'s) beside them."""
    return [{**_slot(service, phase["slot"], busy=phase["phase"] != "idle"), "phase": phase}
            for phase in service.health()["phases"]]


def _slot(service: Service, slot: int, busy: bool) -> dict[str, Any]:
    defaults = service.defaults
    sampling = asdict(defaults.sampling)
    return {"id": slot, "id_task": -1, "n_ctx": service.pair.n_ctx, "speculative": service.pair.draft is not None
            or defaults.draft_mode not in (None, "none"), "is_processing": busy,
            "params": {**sampling, "n_predict": service.max_tokens or -1,
                       "seed": defaults.seed if defaults.seed is not None else -1,
                       "speculative.n_max": defaults.draft_max, "speculative.mode": defaults.draft_mode or "default",
                       "verify": defaults.verify_rule}}


def _fields(body: object) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    return body


def _flag(fields: dict[str, Any], name: str, default: bool) -> bool:
    value = fields.get(name, default)
    if not isinstance(value, bool):
        raise RequestError(f"'{name}' must be true or false", param=name)
    return value


def _piece(data: bytes) -> str | list[int]:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return list(data)
