"""What one verify row's law costs through llama.cpp's own C sampler chain (penalties → top-k → top-p → min-p →
temperature, as `llama_sampler_*` through the low-level API, over a `llama_token_data_array` filled from NumPy
without a Python loop) against spec-cli's NumPy path (`sampling.probabilities`), at a Qwen-size vocabulary,
side by side in one run, with the largest difference between the two laws.

Issue 42 asked for the chain in C to bring a sampled K = 5 round under 1 ms (chat defaults) and 3 ms (the full
vocabulary); this measures whether a row through it is cheaper than the row it would replace:

    python benchmarks/c_sampler_chain.py [--vocab 151936] [--rows 200]
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import time

import llama_cpp
import numpy as np

from spec_cli.decoding.sampling import SamplingParams, probabilities

SETTINGS = {
    "chat defaults (T 0.8, top-k 40, top-p 0.95, min-p 0.05)": SamplingParams(temperature=0.8),
    "full vocabulary (T 1, top-k 0, top-p 1, min-p 0)": SamplingParams(temperature=1.0, top_k=0, top_p=1.0,
                                                                       min_p=0.0),
}
TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])


def chain(params: SamplingParams) -> llama_cpp.llama_sampler_p:
    """llama.cpp's chain in its own order, ending in a softmax at T (`temp_ext` with no range: plain T)."""
    sampler = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    if params.top_k:
        llama_cpp.llama_sampler_chain_add(sampler, llama_cpp.llama_sampler_init_top_k(params.top_k))
    llama_cpp.llama_sampler_chain_add(sampler, llama_cpp.llama_sampler_init_top_p(params.top_p, 1))
    llama_cpp.llama_sampler_chain_add(sampler, llama_cpp.llama_sampler_init_min_p(params.min_p, 1))
    llama_cpp.llama_sampler_chain_add(sampler, llama_cpp.llama_sampler_init_temp(params.temperature))
    return sampler


def c_law(sampler: llama_cpp.llama_sampler_p, logits: np.ndarray, buffer: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(ids, probabilities) of the row through the chain: the array is filled by NumPy, the chain cuts it in
    place, and the kept logits are turned into probabilities here (the chain's last step leaves logits)."""
    buffer["id"] = np.arange(logits.size, dtype=np.int32)
    buffer["logit"] = logits
    array = llama_cpp.llama_token_data_array(
        data=buffer.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_token_data)), size=logits.size, selected=-1,
        sorted=False)
    llama_cpp.llama_sampler_apply(sampler, ctypes.byref(array))
    kept = buffer[:array.size]
    z = kept["logit"].astype(np.float64)
    p = np.exp(z - z.max())
    return kept["id"], p / p.sum()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=151_936)
    parser.add_argument("--rows", type=int, default=200)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    rows = (rng.standard_normal((args.rows, args.vocab)) * 3).astype(np.float32)
    buffer = np.empty(args.vocab, dtype=TOKEN_DATA)
    print(f"{args.vocab} tokens, {args.rows} rows, median µs a row")
    print("| sampling | NumPy (spec-cli) | llama.cpp C chain | max |Δp| |")
    print("| --- | --- | --- | --- |")
    for name, params in SETTINGS.items():
        sampler = chain(params)
        numpy_s, c_s, worst = [], [], 0.0
        for row in rows:
            started = time.perf_counter()
            law = probabilities(row, params)
            numpy_s.append(time.perf_counter() - started)
            started = time.perf_counter()
            ids, p = c_law(sampler, row, buffer)
            c_s.append(time.perf_counter() - started)
            dense = np.zeros(args.vocab)
            dense[ids] = p
            worst = max(worst, float(np.abs(dense - np.asarray(law)).max()))
        llama_cpp.llama_sampler_free(sampler)
        print(f"| {name} | {statistics.median(numpy_s) * 1e6:.0f} | {statistics.median(c_s) * 1e6:.0f} | "
              f"{worst:.1e} |")


if __name__ == "__main__":
    main()
