"""Where a model's layers run: on this machine's GPUs, on RPC workers, or on the CPU, decided when it loads.
The decision for files given by hand and for registry pairs alike; the run reports it in words."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from spec_cli.errors import SpecError
from spec_cli.llama.kernels import machine_memory
from spec_cli.llama.model import Model
from spec_cli.llama.rpc import device_list, device_memory, local_devices, local_gpu_names, parse_endpoints


def load_model(path: str | os.PathLike[str], gpu_layers: int | None, workers: Sequence[str],
               tensor_split: Sequence[float], load_mtp: bool = False, drafts: bool = False) -> Model:
    """One model on this machine's devices and `workers`' ("host:port"), every layer on devices by default
    when there are workers; with `load_mtp`, its MTP layers too (where it has them); `drafts` for the draft
    model (the kernels this machine runs may differ for it: `kernels`)."""
    endpoints = parse_endpoints(",".join(workers)) if workers else ()
    devices = device_list(endpoints)
    if tensor_split:
        _check_split(tensor_split, len(devices) - 1 if devices is not None else len(local_devices()))
    gpus = local_gpu_names()
    layers = default_gpu_layers(gpu_layers, bool(endpoints), gpus)
    model = Model(Path(path), layers, devices=devices, tensor_split=tensor_split, load_mtp=load_mtp, drafts=drafts)
    model.placement = describe(layers, [str(e) for e in endpoints], gpus)
    return model


def default_gpu_layers(given: int | None, workers: bool, gpus: Sequence[str]) -> int:
    """The layers offloaded: as given; else every layer that fits (-1, llama.cpp's own default) where there
    is a GPU or a worker to put them on, and none on a machine with neither."""
    if given is not None:
        return given
    return -1 if workers or gpus else 0


def describe(layers: int, workers: Sequence[str], gpus: Sequence[str]) -> str:
    """Where a model runs, in words: "CPU", or the devices its layers go to and how many."""
    devices = [*workers, *gpus]
    if layers == 0 or not devices:
        return "CPU"
    return f"{', '.join(devices)} ({'every layer that fits' if layers < 0 else f'{layers} layers'}; the rest on the CPU)"


def _check_split(weights: Sequence[float], n_devices: int) -> None:
    if len(weights) != n_devices:
        raise SpecError(f"--tensor-split gives {len(weights)} weights for {n_devices} devices "
                        "(one per RPC worker, in --rpc order, then one per local GPU)")
    if any(w < 0 for w in weights) or not any(weights):
        raise SpecError("--tensor-split weights must be >= 0 and not all 0")


def kv_room(model: Model) -> int:
    """Bytes a context's KV cache may take where `model` runs: half of what the local GPUs have free where its
    layers went to devices, else half of this machine's available memory (the weights, the draft's cache and
    everything else the machine runs keep the rest)."""
    if model.placement != "CPU":
        free = sum(device_memory(device)[0] for device in local_devices())
        if free:
            return free // 2
    return available_memory() // 2


def available_memory() -> int:
    """This machine's available memory in bytes: MemAvailable where Linux says it, else its physical memory."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return machine_memory()

