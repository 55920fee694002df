"""Speculative decoding on a recurrent target: how much taking rejected tokens back costs, side by side.

There is no small recurrent GGUF to download here, so this writes one: a Mamba model (recurrent:
snapshot + replay) or an LFM2 model (hybrid: rolled back in place), 1024 wide, 12 layers, F32, whose
layers add little to the residual stream, so that its quantized copies agree with it most of the time, as
a real self-draft does. Its Q8_0 or Q4_0 re-encoding (llama.cpp's quantizer) drafts for it; `spec bench`
runs the target alone and each configuration interleaved and prints the rollback share (snapshots,
restores, replays) next to the speed-up.

    python benchmarks/recurrent_pair.py [--arch mamba|lfm2] [--draft q8_0|q4_0] [-- spec bench options]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from support.tiny_models import write_model  # noqa: E402  (the test suite's GGUF writer)

from spec_cli.cli.app import app  # noqa: E402
from spec_cli.llama.gguf import quantize  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=Path("/tmp/spec-recurrent"), help="where the models go")
    parser.add_argument("--arch", choices=("mamba", "lfm2"), default="mamba", help="the target's architecture")
    parser.add_argument("--draft", choices=("q8_0", "q4_0"), default="q8_0", help="the draft's encoding")
    args, bench_options = parser.parse_known_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    target = args.dir / f"{args.arch}-1024x12.f32.gguf"
    if not target.exists():
        # eos=1 (BOS, which the model never emits): every run generates its full length.
        write_model(target, 1, arch=args.arch, n_embd=1024, n_layer=12, layer_scale=0.05, eos=1)
    draft = args.dir / f"{args.arch}-1024x12.{args.draft}.gguf"
    if not draft.exists():
        quantize(target, draft, args.draft, 2)
    options = [o for o in bench_options if o != "--"] or ["-k", "3,5,auto", "-n", "128"]
    app(["bench", "--target", str(target), "--draft", str(draft), *options])


if __name__ == "__main__":
    main()
