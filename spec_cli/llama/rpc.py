"""A target split over llama.cpp RPC workers: the one module that touches ggml's backend registry.

llama.cpp's RPC backend turns a worker on another machine (`spec worker`, or llama.cpp's `rpc-server`) into a
device: the model's layers go to it as they would to a GPU, and every pass of the model pays network round
trips. Speculation pays them once per K + 1 tokens instead of once per token.

Everything goes through the backend registry of the libggml that llama-cpp-python ships, found by name
("RPC") and through `ggml_backend_reg_get_proc_address`, as llama.cpp's own tools do; llama-cpp-python's
`rpc_servers` argument no longer reaches current llama.cpp.

The RPC client in llama.cpp aborts the process when a worker fails (it cannot report an error upwards), so
this module speaks the protocol's HELLO itself before llama.cpp connects (an unreachable worker, a busy one
or a protocol mismatch becomes one line), and turns llama.cpp's abort into one line and exit 1 once a
worker dies mid-generation, after the caller has had its say (`on_worker_lost`).
"""

from __future__ import annotations

import ctypes
import os
import socket
import struct
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import llama_cpp
from llama_cpp._ggml import libggml

from spec_cli.errors import SpecError

DEFAULT_PORT = 50052
# The protocol version of the llama.cpp that the pinned llama-cpp-python vendors (RPC_PROTO_*_VERSION in
# ggml-rpc.h); a worker must speak the same major version and no newer minor one.
PROTOCOL = (7, 0, 0)
CONNECT_TIMEOUT = 5.0  # seconds a worker has to accept a connection and answer HELLO
EXIT_WORKER_LOST = 1
REBUILD = ('CMAKE_ARGS="-DGGML_RPC=on" pip install --force-reinstall --no-cache-dir --no-deps '
           f'"llama-cpp-python=={llama_cpp.__version__}"')

# Command numbers and sizes of the RPC protocol (ggml-rpc.cpp: enum rpc_cmd and its messages).
_CMD_GET_DEVICE_MEMORY = 11
_CMD_HELLO = 14
_CMD_DEVICE_COUNT = 15
_CONN_CAPS = 24  # RPC_CONN_CAPS_SIZE: transport capabilities; all zero asks for plain TCP

_GPU_TYPES = (1, 2)  # GGML_BACKEND_DEVICE_TYPE_GPU, _IGPU: the local devices llama.cpp offloads to


@dataclass(frozen=True)
class Endpoint:
    """A worker's address as llama.cpp writes it: HOST:PORT (IPv4 or a host name)."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class WorkerInfo:
    """What a worker answered to HELLO: its protocol version and each device's (free, total) bytes."""

    endpoint: Endpoint
    version: tuple[int, int, int]
    memory: tuple[tuple[int, int], ...]


def parse_endpoints(text: str, option: str = "--rpc") -> tuple[Endpoint, ...]:
    """`HOST:PORT[,HOST:PORT…]` as given to `option`, checked: each once, ports 1-65535."""
    endpoints: list[Endpoint] = []
    for item in (part.strip() for part in text.split(",")):
        host, colon, port = item.rpartition(":")
        if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536 or ":" in host:
            raise SpecError(f"{option}: {item!r} is not HOST:PORT (for example 192.168.1.7:{DEFAULT_PORT})")
        endpoint = Endpoint(host, int(port))
        if endpoint in endpoints:
            raise SpecError(f"{option}: {endpoint} is listed twice")
        endpoints.append(endpoint)
    return tuple(endpoints)


def supported() -> bool:
    """True when this llama-cpp-python was built with llama.cpp's RPC backend (-DGGML_RPC=on)."""
    return bool(llama_cpp.llama_supports_rpc())


def require() -> None:
    if not supported():
        raise SpecError(f"this llama-cpp-python was built without RPC; rebuild it with: {REBUILD}")


def probe(endpoint: Endpoint, timeout: float = CONNECT_TIMEOUT) -> WorkerInfo:
    """Say HELLO to a worker and ask for its devices' memory, as llama.cpp's client would, but with a
    timeout and an error in one line where llama.cpp would hang (a worker busy with another client) or
    abort (no worker, a protocol mismatch)."""
    try:
        with socket.create_connection((endpoint.host, endpoint.port), timeout=timeout) as sock:
            major, minor, patch = _call(sock, _CMD_HELLO, bytes(_CONN_CAPS), 4 + _CONN_CAPS)[:3]
            if major != PROTOCOL[0] or minor > PROTOCOL[1]:
                raise SpecError(f"RPC handshake failed for {endpoint}: RPC server version mismatch: "
                                f"{major}.{minor}.{patch} (this build speaks {PROTOCOL[0]}.{PROTOCOL[1]}.x)")
            (count,) = struct.unpack("<I", _call(sock, _CMD_DEVICE_COUNT, b"", 4))
            memory = tuple(struct.unpack("<QQ", _call(sock, _CMD_GET_DEVICE_MEMORY, struct.pack("<I", i), 16))
                           for i in range(count))
    except socket.gaierror:
        raise SpecError(f"RPC worker {endpoint}: unknown host {endpoint.host!r}") from None
    except ConnectionRefusedError:
        raise SpecError(f"RPC worker {endpoint} is unreachable: connection refused "
                        f"(is `spec worker --port {endpoint.port}` running there?)") from None
    except TimeoutError:
        raise SpecError(f"RPC worker {endpoint} did not answer within {timeout:g} s: a worker serves one "
                        "client at a time; is another spec or llama.cpp using it?") from None
    except (OSError, EOFError) as exc:
        raise SpecError(f"RPC worker {endpoint} is unreachable: {getattr(exc, 'strerror', None) or exc}") from None
    return WorkerInfo(endpoint, (major, minor, patch), memory)


def _call(sock: socket.socket, command: int, request: bytes, response_size: int) -> bytes:
    """One request and its response: | command (1 byte) | size (8) | request |, then | size (8) | response |."""
    sock.sendall(struct.pack("<BQ", command, len(request)) + request)
    (size,) = struct.unpack("<Q", _receive(sock, 8))
    if size != response_size:
        raise EOFError(f"malformed response ({size} bytes where {response_size} were expected)")
    return _receive(sock, size)


def _receive(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise EOFError("the worker closed the connection")
        data += chunk
    return data


# --- devices: workers registered with ggml, and the local devices a model may use beside them ---

_registered: dict[Endpoint, list[int]] = {}  # each worker's device handles, registered once per process


def worker_devices(endpoints: Sequence[Endpoint]) -> list[int]:
    """The devices of `endpoints`, in order, each worker checked (`probe`) and registered with ggml once."""
    require()
    _lib.set_abort_callback(_on_abort)  # from now on a lost worker is one line, not llama.cpp's abort
    devices: list[int] = []
    for endpoint in endpoints:
        if endpoint not in _registered:
            probe(endpoint)
            _registered[endpoint] = _register(endpoint)
        devices.extend(_registered[endpoint])
    return devices


def _register(endpoint: Endpoint) -> list[int]:
    add_server = _rpc_function("ggml_backend_rpc_add_server", ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p))
    server = add_server(str(endpoint).encode())
    if not server:
        raise SpecError(f"RPC worker {endpoint} offers no devices")
    _lib.register(server)
    return [_lib.reg_dev_get(server, i) for i in range(_lib.reg_dev_count(server))]


def local_devices() -> list[int]:
    """This machine's GPUs, as llama.cpp would offload to them (integrated ones only when there is no
    discrete one); workers registered in this process are left out."""
    devices = [_lib.dev_get(i) for i in range(_lib.dev_count())]
    local = [d for d in devices if _lib.dev_type(d) in _GPU_TYPES and _lib.reg_name(_lib.dev_reg(d)) != b"RPC"]
    discrete = [d for d in local if _lib.dev_type(d) == _GPU_TYPES[0]]
    return discrete or local


def local_gpu_names() -> list[str]:
    """llama.cpp's names of this machine's GPUs that layers go to ("CUDA0", "Metal" …)."""
    return [_lib.dev_name(d).decode() for d in local_devices()]


def device_list(endpoints: Sequence[Endpoint]) -> ctypes.Array[ctypes.c_void_p] | None:
    """The NULL-terminated device list for a model's `llama_model_params.devices`: the workers', then the
    local GPUs. None (llama.cpp's own choice) while no worker is registered in this process, so a model
    loads as it always did; once one is, a model without workers is kept to local devices explicitly."""
    if not endpoints and not _registered:
        return None
    devices = worker_devices(endpoints) + local_devices()
    return (ctypes.c_void_p * (len(devices) + 1))(*devices, None)


def device_memory(device: int) -> tuple[int, int]:
    """(free, total) bytes of a local device."""
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    _lib.dev_memory(device, ctypes.byref(free), ctypes.byref(total))
    return free.value, total.value


# --- a worker ---

def server(host: str, port: int, threads: int, cache_dir: str | None) -> threading.Thread:
    """llama.cpp's RPC server for this process, on this machine's GPUs (else its CPU), as a daemon thread to
    start: the server never returns, and the main thread must stay free to take Ctrl-C."""
    require()
    _check_port_free(host, port)
    devices = _devices_to_serve()
    array = (ctypes.c_void_p * len(devices))(*devices)
    start = _rpc_function("ggml_backend_rpc_start_server",
                          ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t,
                                           ctypes.POINTER(ctypes.c_void_p)))
    endpoint = f"{host}:{port}".encode()
    cache = cache_dir.encode() if cache_dir else None
    return threading.Thread(target=start, args=(endpoint, cache, threads, len(devices), array), daemon=True,
                            name="rpc-server")


def served_devices() -> list[tuple[str, str, int, int]]:
    """(name, description, free, total) of each device `server` offers."""
    return [(_lib.dev_name(d).decode(), _lib.dev_description(d).decode(), *device_memory(d))
            for d in _devices_to_serve()]


def _devices_to_serve() -> list[int]:
    return local_devices() or [_lib.dev_by_type(0)]  # GGML_BACKEND_DEVICE_TYPE_CPU


def _rpc_function(name: str, prototype: type) -> Callable:
    """A function of the RPC backend, found by name in ggml's registry as llama.cpp's own tools find it."""
    return ctypes.cast(_lib.get_proc_address(_lib.reg_by_name(b"RPC"), name.encode()), prototype)


def _check_port_free(host: str, port: int) -> None:
    """Bind as llama.cpp's server will (SO_REUSEADDR), so a port in use is one line, not its silent return."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise SpecError(f"cannot listen on {host}:{port}: {exc.strerror}") from None


# --- a worker lost mid-generation ---

_last_words: list[Callable[[str], None]] = []


@contextmanager
def on_worker_lost(handler: Callable[[str], None]) -> Iterator[None]:
    """While inside, a worker that dies makes `handler` run with a one-line message before the process
    exits with status 1: llama.cpp's RPC client aborts, so this is the caller's only chance to keep the
    text so far. It may run on llama.cpp's dispatcher thread while the main one waits inside llama.cpp."""
    _last_words.append(handler)
    try:
        yield
    finally:
        _last_words.remove(handler)


@ctypes.CFUNCTYPE(None, ctypes.c_char_p)
def _on_abort(message: bytes) -> None:
    text = message.decode("utf-8", errors="replace").strip()
    if "ggml-rpc" not in text.split(":", 1)[0]:
        sys.stderr.write(f"{text}\n")  # not ours: llama.cpp's own abort follows
        return
    reason = text.split(": ", 1)[-1]
    lost = [str(e) for e in _registered if not _answers(e)]
    who = f"RPC worker {', '.join(lost)}" if lost else "an RPC worker"
    line = f"{who} stopped answering ({reason})"
    try:
        if _last_words:
            _last_words[-1](f"{line}; generation stopped")
        else:
            sys.stderr.write(f"spec: error: {line}\n")
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(EXIT_WORKER_LOST)


def _answers(endpoint: Endpoint) -> bool:
    """Whether a worker is still there. A dead one refuses the connection, or (while its process is going
    away) drops it unanswered; a live one accepts it and waits for a command, even while it serves us."""
    try:
        sock = socket.create_connection((endpoint.host, endpoint.port), timeout=1.0)
    except OSError:
        return False
    with sock:
        sock.settimeout(0.5)
        try:
            return sock.recv(1) != b""
        except TimeoutError:
            return True
        except OSError:
            return False


class _Ggml:
    """The few ggml registry functions this module calls, typed once."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        p, s, c = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p
        self.reg_by_name = _fn(lib.ggml_backend_reg_by_name, p, c)
        self.get_proc_address = _fn(lib.ggml_backend_reg_get_proc_address, p, p, c)
        self.register = _fn(lib.ggml_backend_register, None, p)
        self.reg_name = _fn(lib.ggml_backend_reg_name, c, p)
        self.reg_dev_count = _fn(lib.ggml_backend_reg_dev_count, s, p)
        self.reg_dev_get = _fn(lib.ggml_backend_reg_dev_get, p, p, s)
        self.dev_count = _fn(lib.ggml_backend_dev_count, s)
        self.dev_get = _fn(lib.ggml_backend_dev_get, p, s)
        self.dev_by_type = _fn(lib.ggml_backend_dev_by_type, p, ctypes.c_int)
        self.dev_type = _fn(lib.ggml_backend_dev_type, ctypes.c_int, p)
        self.dev_reg = _fn(lib.ggml_backend_dev_backend_reg, p, p)
        self.dev_name = _fn(lib.ggml_backend_dev_name, c, p)
        self.dev_description = _fn(lib.ggml_backend_dev_description, c, p)
        self.dev_memory = _fn(lib.ggml_backend_dev_memory, None, p, ctypes.POINTER(s), ctypes.POINTER(s))
        self.set_abort_callback = _fn(lib.ggml_set_abort_callback, p, type(_on_abort))


def _fn(function: Callable, restype: object, *argtypes: object) -> Callable:
    function.restype = restype
    function.argtypes = argtypes
    return function


_lib = _Ggml(libggml)
