"""`spec serve`: the pair behind an OpenAI-compatible HTTP API, for editors, agents and chat front-ends."""

from __future__ import annotations

import os
import re
from dataclasses import replace
from typing import Annotated, Optional

import typer

from spec_cli.conversation import session as conversation
from spec_cli.cli.common import EXIT_USAGE, csv_list, reachable_from_outside, stop_signals_raise, user_errors
from spec_cli.cli.options import (ChatFormatOpt, DraftMaxOpt, DraftModeOpt, LoadOptions, MemoryOptions, NoDraftOpt,
                                  RequestFlags, VerifyOpt, loads_pair, open_pair, remembers)
from spec_cli.decoding.scheduler import MAX_SEQUENCES
from spec_cli.drafting.modes import FED_MODES
from spec_cli.errors import SpecError
from spec_cli.llama import rpc
from spec_cli.llama.kernels import machine_memory
from spec_cli.models import registry
from spec_cli.pair import Pair
from spec_cli.request import AUTO, GenerationRequest
from spec_cli.server import app as server
from spec_cli.server.connections import MIB, Limits
from spec_cli.server.service import DEFAULT_QUEUE, Service

DEFAULT_CACHE_RAM = "1GiB"
SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([KMG](?:i?B)?)?", re.IGNORECASE)
UNITS = {"K": 2**10, "M": 2**20, "G": 2**30}
from spec_cli.terminal.output import error, note, serving

API_KEY_ENV = "SPEC_API_KEY"
DEFAULT_PARALLEL = 4
SERVE_EXAMPLES = f"""\
Examples:

  spec serve                                   # the default pair on http://127.0.0.1:{server.DEFAULT_PORT}/v1

  spec serve --target big.gguf --draft small.gguf -k auto --ctx 8192

  spec serve --pair qwen2.5-7b --port 9000 --model-name qwen

  spec serve --parallel 8                      # eight clients generate at once, one verify pass for all

  spec serve --host 0.0.0.0 --allow-remote --api-key "$(cat ~/.spec-key)"   # other machines, with a key

  spec serve --cors http://localhost:3000      # a browser app on that origin may call it

  spec serve --memory ~/agent.mem              # answers drafted from earlier ones, kept across restarts

  curl http://127.0.0.1:{server.DEFAULT_PORT}/v1/chat/completions -d '{{"messages": [{{"role": "user", "content": "Hi"}}]}}'

  curl http://127.0.0.1:{server.DEFAULT_PORT}/v1/chat/completions -d '{{"messages": [{{"role": "user", "content": "A cat, as JSON"}}], "response_format": {{"type": "json_object"}}}}'
"""


@loads_pair
@remembers
def serve(
    load: LoadOptions = LoadOptions(),
    draft_max: DraftMaxOpt = None,
    draft_mode: DraftModeOpt = None,
    memory: MemoryOptions = MemoryOptions(),
    verify: VerifyOpt = None,
    max_tokens: Annotated[Optional[int], typer.Option("--max-tokens", "-n", min=1, help="Longest answer for requests that set no max_tokens (default: until the context is full).", show_default=False)] = None,
    chat_format: ChatFormatOpt = None,
    no_draft: NoDraftOpt = False,
    host: Annotated[str, typer.Option("--host", help="Address to listen on; anything but loopback needs --allow-remote.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="TCP port to listen on (0: any free port, printed at start).")] = server.DEFAULT_PORT,
    allow_remote: Annotated[bool, typer.Option("--allow-remote", help="Allow a --host other machines can reach.")] = False,
    api_key: Annotated[Optional[str], typer.Option("--api-key", envvar=API_KEY_ENV, help="Require 'Authorization: Bearer KEY' on every request but /health (or set SPEC_API_KEY, which keeps the key out of the process list).", show_default=False)] = None,
    parallel: Annotated[Optional[int], typer.Option("--parallel", "-np", min=1, max=MAX_SEQUENCES, help=f"Generations that run at once, verified together in one pass a step (default {DEFAULT_PARALLEL}: on a CPU or a GPU a pass of several sequences costs little more than one; 1 for a pair that drafts with an MTP head, EAGLE-3 head or DFlash drafter, where more slots each get a head of their own). Each has --ctx tokens of its own.", show_default=False)] = None,
    reasoning_budget: Annotated[Optional[int], typer.Option("--reasoning-budget", min=0, metavar="N", help="Close a thought after N tokens on a thinking template (a request's reasoning_budget overrides it; default: no bound).", show_default=False)] = None,
    cache_ram: Annotated[str, typer.Option("--cache-ram", metavar="SIZE", help="Host RAM that keeps finished sequences' states, so that a request on another slot (an agent's next call, the same long system prompt and tools) starts from them instead of prefilling again: MiB, or with a unit (512MiB, 2GiB); 0 turns it off.")] = DEFAULT_CACHE_RAM,
    queue: Annotated[int, typer.Option("--queue", min=0, help="Requests that may wait while every --parallel slot generates; more are answered 503 at once.")] = DEFAULT_QUEUE,
    cors: Annotated[Optional[str], typer.Option("--cors", metavar="ORIGIN[,ORIGIN]", help="Let web pages from these origins call the server from a browser (e.g. http://localhost:3000; * for any page).", show_default=False)] = None,
    max_body: Annotated[float, typer.Option("--max-body", min=0.001, metavar="MIB", help="Largest request body in MiB; larger ones are answered 413.")] = Limits.body_bytes / MIB,
    header_timeout: Annotated[float, typer.Option("--header-timeout", min=0.1, metavar="S", help="Seconds a request's headers may take to arrive; a connection that stalls longer is closed.")] = Limits.header_timeout_s,
    body_timeout: Annotated[float, typer.Option("--body-timeout", min=0.1, metavar="S", help="Seconds a request's body may take to arrive after its headers; then 408.")] = Limits.body_timeout_s,
    max_connections: Annotated[int, typer.Option("--max-connections", min=1, help="Connections open at once; one more closes the longest idle one, or is answered 503 when none is idle.")] = Limits.connections,
    allow_image_urls: Annotated[bool, typer.Option("--allow-image-urls", help="Fetch images that chats give as http(s) URLs (at most 32 MiB and 10 s each); without it only data: URLs are taken.")] = False,
    metrics: Annotated[bool, typer.Option("--metrics", help="Serve GET /metrics: Prometheus text with llama-server's metric names (tokens, seconds, requests, drafted and accepted tokens by position) and each way of drafting's share.")] = False,
    model_name: Annotated[Optional[str], typer.Option("--model-name", help="The model id clients send and /v1/models lists (default: the pair's name, or the target file's).", show_default=False)] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No line per answer on stderr (the line that says where it listens stays).")] = False,
) -> None:
    """Serve the pair over OpenAI's HTTP API, with exact speculative decoding: /v1/chat/completions, /v1/completions (streamed or not), /v1/models, /health.

    Point any OpenAI-compatible client at http://HOST:PORT/v1. Requests may set temperature, top_p, top_k, min_p, penalties, seed, stop and max_tokens, response_format (json_object, json_schema), grammar, json_schema, tools and tool_choice (calls come back in message.tool_calls, in the convention the chat template writes: forced ones and tool_choice auto held by a grammar), reasoning_budget, and spec-cli's draft_max, draft_mode and verify; sampling they leave out follows what the target's GGUF recommends, as in spec chat. Every answer carries a speculation object (drafted, accepted, acceptance, tokens per target pass, tokens/s).

    Up to --parallel generations run at once, in arrival order, verified together in one target pass a step; with -k auto (the default for several) each gets the K that raises the whole batch's tokens per second, 0 where drafting does not pay. A chat that resends its history costs only its new tokens, even when other clients' requests come in between, and a request on another slot starts from the states --cache-ram keeps. A client that disconnects stops its generation, waiting or running. GET /health reports the sequences generating, the requests waiting, tokens per second and acceptance. Text in messages is always text: typed control tokens (<|im_end|>) are not parsed. One line per answer goes to stderr.
    """
    try:
        cache_bytes = ram_size(cache_ram, "--cache-ram")
    except SpecError as exc:  # a bad option value, as Click's own: status 2
        error(str(exc))
        raise typer.Exit(EXIT_USAGE) from None
    with user_errors():
        remote = reachable_from_outside(host, allow_remote, "use this server", " (and --api-key to require a key)")
        if api_key is None:  # Click reads an empty SPEC_API_KEY as unset: an empty key must not pass unseen
            api_key = os.environ.get(API_KEY_ENV)
        if api_key is not None and not api_key.strip():
            raise SpecError("the API key is empty (--api-key or SPEC_API_KEY): give a key, or set neither to "
                            "serve without one")
        origins = csv_list(cors, str) if cors is not None else []
        limits = Limits(round(max_body * MIB), header_timeout, body_timeout, max_connections)
        # max_tokens is the server's own: a request that sets none runs until the context is full.
        flags = RequestFlags.from_flags(draft_max, draft_mode, no_draft, verify=verify)
        memory = memory.checked()
        template = conversation.chat_template(chat_format)
        sock = server.listen(host, port)  # before the models load: a port in use is said at once
        sequences = (parallel or DEFAULT_PARALLEL) + 1 if parallel != 1 else 1  # the slots and the pair's own
        with sock, open_pair(replace(load.for_request(flags, no_draft, quiet, images=True),
                                     sequences=sequences)) as loaded:
            memory.apply(loaded.pair, default_file=False, quiet=quiet)
            slots = _slots(loaded.pair, flags, parallel)
            # Several at once: K by the batch's goodput, unless -k says otherwise.
            defaults = flags.for_pair(loaded) if slots == 1 or flags.k_given else replace(
                flags.for_pair(loaded), draft_max=AUTO)
            log = (lambda _line: None) if quiet else note
            service = Service(loaded.pair, model_name or default_name(load), defaults, max_tokens, queue,
                              template, log=log, parallel=slots, reasoning_budget=reasoning_budget,
                              cache_ram=cache_bytes, allow_image_urls=allow_image_urls)
            address = sock.getsockname()
            serving(service.name, f"http://{_url_host(address[0])}:{address[1]}/v1",
                    f"{_drafting(loaded.pair, defaults)}, {slots} at once")
            if remote:
                note(f"warning: other machines can reach this server on {host}"
                     + ("" if api_key else "; anyone who can reach it can use it (--api-key requires a key)"))
            if "*" in origins and not api_key:
                note("warning: --cors * lets any web page open in a browser here use this server "
                     "(--api-key requires a key)")
            try:
                with rpc.on_worker_lost(error), stop_signals_raise():
                    app = server.create_app(service, api_key, origins, limits, metrics_route=metrics)
                    http = server.http_server(app, limits, log)
                    with server.hang_up_stops(http):
                        http.run(sockets=[sock])
            except KeyboardInterrupt:
                pass
            finally:
                service.close()
            note("server stopped")


def ram_size(text: str, flag: str) -> int:
    """A size of host RAM in bytes: MiB, or a number with a unit (KiB, MiB, GiB; K, M, G), within the machine's
    memory; a `SpecError` that says what was wrong otherwise."""
    found = SIZE.fullmatch(text.strip())
    if found is None:
        raise SpecError(f"{flag} must be a size: MiB (2048), or with a unit (512MiB, 2GiB); got {text!r}")
    size = round(float(found.group(1)) * UNITS[(found.group(2) or "M")[0].upper()])
    memory = machine_memory()
    if memory and size > memory:
        raise SpecError(f"{flag} {text} is more than this machine's memory ({memory / 2**30:.1f} GiB)")
    return size


def _slots(pair: Pair, flags: RequestFlags, parallel: int | None) -> int:
    """How many generations run at once: --parallel, else `DEFAULT_PARALLEL`, or 1 where the pair drafts with a
    drafter fed by the target's own states (an MTP, EAGLE-3 or DFlash head: each slot then needs one of its
    own, and one sequence is where it is measured best)."""
    mode = pair.mode_for(flags.request)
    fed = mode in FED_MODES or mode == "hybrid" and any(name in FED_MODES for name in pair.drafting.own_models())
    return parallel or (1 if fed else DEFAULT_PARALLEL)


def default_name(load: LoadOptions) -> str:
    if load.target is not None:
        return load.target.stem
    return load.pair or registry.load_registry().default


def _drafting(pair: Pair, defaults: GenerationRequest) -> str:
    mode = pair.mode_for(defaults)
    return "no draft" if mode == "none" else f"{mode} K={defaults.draft_max}"


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
