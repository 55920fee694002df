"""llama.cpp's own routes beside OpenAI's, in llama-server's shapes (its `tools/server/README.md`): what front ends,
editor plugins and scripts written against llama-server call to complete text (`/completion`), fill in the middle
of code (`/infill`), count tokens, turn ids back into text, render a chat's prompt and read the server's settings
and slots. Plain functions of a parsed body; `app` reads the body and answers on the same loop as OpenAI's routes."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from spec_cli import __version__
from spec_cli.api import openai_api
from spec_cli.api.errors import RequestError, unicode_text
from spec_cli.decoding.stats import Stats
from spec_cli.llama.model import Model
from spec_cli.server.jobs import Finished
from spec_cli.server.service import Service

REPO_NAME = "myproject\n"  # llama-server's repo-level FIM pattern names the project so
FILE_NAME = "filename\n"  # and the file being completed
SNIPPET = "\n\n--- snippet ---\n\n"  # an extra chunk's separator where the vocabulary has no FIM_SEP


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
    mode = service.pair.mode_for(defaults)
    return {"id": slot, "id_task": -1, "n_ctx": service.pair.n_ctx, "speculative": mode != "none",
            "is_processing": busy,
            "params": {**asdict(defaults.sampling), "n_predict": service.max_tokens or -1,
                       "seed": defaults.seed if defaults.seed is not None else -1,
                       "speculative.n_max": defaults.draft_max, "speculative.mode": mode,
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


def completion_body(body: object) -> dict[str, Any]:
    """A `/completion` body as the `/v1/completions` body it asks for: llama-server's `n_predict` (-1: until the
    context is full) is `max_tokens`; its other fields (`prompt`, sampling, `seed`, `stop`, `grammar`,
    `json_schema`, `stream`) are named alike; what spec-cli does not do (`n_probs`) is a 400 naming it."""
    fields = dict(_fields(body))
    n_predict = fields.pop("n_predict", None)
    if n_predict is not None and (not isinstance(n_predict, int) or isinstance(n_predict, bool)
                                  or not (n_predict == -1 or n_predict >= 1)):
        raise RequestError(f"'n_predict' must be -1 (until the context is full) or >= 1, got {n_predict!r}",
                           param="n_predict")
    if fields.get("n_probs"):
        raise RequestError("'n_probs' is not supported by this server", param="n_probs",
                           code="unsupported_parameter")
    if n_predict not in (None, -1):
        fields["max_tokens"] = n_predict
    return fields


def infill_prompt(model: Model, body: dict[str, Any], n_batch: int, n_ctx: int, n_predict: int) -> list[int]:
    """`/infill`'s prompt as llama-server's `format_prompt_infill` makes it: the extra chunks (after FIM_REP and
    each behind FIM_SEP and its file name where the vocabulary has them, else behind a snippet line), then
    FIM_PRE, the prefix's last tokens and `prompt`, FIM_SUF, the suffix's first tokens, FIM_MID; the prefix and
    the suffix share one batch 3:1, the chunks what the context leaves."""
    fim = model.fim_tokens
    missing = [name for name in ("pre", "suf", "mid") if name not in fim]
    if missing:
        raise RequestError(f"{model.path.name} has no fill-in-the-middle tokens (FIM_{missing[0].upper()} is "
                           "missing): /infill needs a code model trained for it", param="input_prefix")

    def text(name: str, default: str = "") -> list[int]:
        value = body.get(name, default)
        if not isinstance(value, str):
            raise RequestError(f"'{name}' must be a string", param=name)
        return model.tokenize_bytes(unicode_text(value, name).encode("utf-8"), False, False)

    extra: list[int] = [fim["rep"], *model.tokenize_bytes(REPO_NAME.encode(), False, False)] if "rep" in fim else []
    chunks = body.get("input_extra") or []
    if not isinstance(chunks, list) or not all(isinstance(chunk, dict) for chunk in chunks):
        raise RequestError("'input_extra' must be a list of {\"filename\", \"text\"} objects", param="input_extra")
    for i, chunk in enumerate(chunks):
        where = f"input_extra[{i}]"
        if not isinstance(chunk.get("text", ""), str) or not isinstance(chunk.get("filename", "tmp"), str):
            raise RequestError(f"'{where}' must hold a string 'filename' and 'text'", param=where)
        if "sep" in fim:
            extra += [fim["sep"], *model.tokenize_bytes(f"{chunk.get('filename', 'tmp')}\n".encode(), False, False)]
        else:
            extra += model.tokenize_bytes(SNIPPET.encode(), False, False)
        extra += model.tokenize_bytes(unicode_text(chunk.get("text", ""), where).encode("utf-8"), False, False)
    if "sep" in fim:
        extra += [fim["sep"], *model.tokenize_bytes(FILE_NAME.encode(), False, False)]
    prefix, suffix, prompt = text("input_prefix"), text("input_suffix"), text("prompt")
    prefix = prefix[len(prefix) - min(len(prefix), 3 * (n_batch // 4)):]
    suffix = suffix[:min(len(suffix), max(0, n_batch // 4 - (2 + len(prompt))))]
    n_extra = min(max(0, n_ctx - n_batch - 2 * n_predict), len(extra))
    bos = [model.vocab_info().bos] if model.vocab_info().add_bos else []
    return [*extra[len(extra) - n_extra:], *bos, fim["pre"], *prefix, *prompt, fim["suf"], *suffix, fim["mid"]]


def completion_answer(model_name: str, content: str, tokens: list[int] | None, finished: Finished | None,
                      stats: Stats, speculation: dict[str, Any]) -> dict[str, Any]:
    """`/completion`'s answer, whole or (with `finished` None) a streamed piece: llama-server's fields, and
    spec-cli's `speculation` beside them."""
    piece = {"content": content, "tokens": tokens or [], "stop": finished is not None}
    if finished is None:
        return piece
    stop_type = "word" if finished.by_stop_string else "eos" if finished.reason == "stop" else "limit"
    prompt_ms, predicted_ms = 1000 * stats.prompt_s, 1000 * stats.decode_s
    return {**piece, "model": model_name, "stop_type": stop_type, "stopping_word": "",
            "tokens_predicted": stats.generated_tokens, "tokens_evaluated": stats.prompt_tokens,
            "tokens_cached": stats.prompt_cached, "truncated": False,
            "timings": {"prompt_n": stats.prompt_tokens - stats.prompt_cached, "prompt_ms": prompt_ms,
                        "prompt_per_second": stats.prompt_tokens_per_second,
                        "predicted_n": stats.generated_tokens, "predicted_ms": predicted_ms,
                        "predicted_per_second": stats.tokens_per_second,
                        "draft_n": stats.drafted, "draft_n_accepted": stats.accepted},
            "speculation": speculation}

