"""`spec doctor` and `spec worker`: what this machine and its llama.cpp build can do, and lending this
machine to another one's `--rpc`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from spec_cli.cli.common import reachable_from_outside, user_errors
from spec_cli.errors import SpecError
from spec_cli.llama import rpc
from spec_cli.llama.kernels import cpu_threads
from spec_cli.models import registry
from spec_cli.reports import models as reports
from spec_cli.terminal.output import note, worker_started
from spec_cli.terminal.tables import show_facts

DOCTOR_EXAMPLES = ("Examples:\n\n  spec doctor\n\n  spec doctor --probe   # try llama.cpp's CPU kernels again (after a driver or "
                   "build change)\n\n  spec doctor --rpc 192.168.1.7:50052,192.168.1.8:50052")


def doctor(
    rpc_workers: Annotated[Optional[str], typer.Option("--rpc", help="Also check that these RPC workers answer, HOST:PORT[,…], and show their devices' free memory.", show_default=False)] = None,
    probe: Annotated[bool, typer.Option("--probe", help="Try llama.cpp's extra CPU kernels (repacked weights, AMX) again in child processes, instead of trusting the verdict cached for this CPU and build.")] = False,
) -> None:
    """Versions, the llama.cpp backend (CPU, CUDA, Metal, RPC), which CPU kernels run here, threads, memory, and where files are kept."""
    with user_errors():
        known = registry.load_registry()
        if probe:
            note("trying llama.cpp's CPU kernels in child processes (a few seconds)")
        show_facts("spec doctor", reports.doctor_facts(known.get(known.default), probe_again=probe))
        if rpc_workers:
            rpc.require()
            workers = [rpc.probe(endpoint) for endpoint in rpc.parse_endpoints(rpc_workers)]
            show_facts("RPC workers", reports.worker_facts(workers))


WORKER_EXAMPLES = f"""\
Examples:

  spec worker                      # 127.0.0.1:{rpc.DEFAULT_PORT}: for `spec run --rpc 127.0.0.1:{rpc.DEFAULT_PORT}` on this machine

  spec worker --host 0.0.0.0 --allow-remote --threads 16    # reachable from other machines: trusted networks only

  spec worker --port 50053 --cache ~/.cache/spec-cli/rpc    # a second worker; weights kept on disk between runs
"""


def worker(
    host: Annotated[str, typer.Option("--host", help="IPv4 address to listen on; anything but loopback needs --allow-remote.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=1, max=65535, help="TCP port to listen on.")] = rpc.DEFAULT_PORT,
    threads: Annotated[Optional[int], typer.Option("--threads", min=1, help="CPU threads for computing (default: every CPU this process may run on: all cores, or those taskset or a container allows).", show_default=False)] = None,
    cache: Annotated[Optional[Path], typer.Option("--cache", help="Keep large tensors received in this folder, so a client that loads the same model again sends hashes instead of weights (default: no cache).", show_default=False)] = None,
    allow_remote: Annotated[bool, typer.Option("--allow-remote", help="Allow a --host other machines can reach. The RPC protocol has no authentication or encryption.")] = False,
) -> None:
    """Lend this machine's GPUs (else its CPU) to `spec run --rpc` on another machine: llama.cpp's RPC server, in this process.

    It serves one client at a time, until Ctrl-C. Anyone who can reach the port can run computations on this machine and read what it holds: keep it on loopback or a network you trust.
    """
    with user_errors():
        # llama.cpp's RPC server binds IPv4 addresses only, and takes no names.
        if reachable_from_outside(host, allow_remote, "reach this worker, and the RPC protocol has no authentication "
                                  "or encryption", ipv4_only=True):
            note(f"warning: anyone who can reach {host}:{port} can run computations on this machine and "
                 "read what it holds (the RPC protocol has no authentication or encryption)")
        if cache is not None:
            _make_folder(cache.expanduser())
        n_threads = threads or cpu_threads()
        server = rpc.server(host, port, n_threads, str(cache.expanduser()) if cache else None)
        try:
            worker_started(f"{host}:{port}", rpc.served_devices(), n_threads)
            server.start()
            while server.is_alive():
                server.join(0.5)
        except KeyboardInterrupt:
            note("worker stopped")
            return
        raise SpecError(f"llama.cpp's RPC server on {host}:{port} stopped (its message is above)")


def _make_folder(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SpecError(f"cannot create {path}: {exc.strerror}") from None
