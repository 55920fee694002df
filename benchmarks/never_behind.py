"""Never behind the target alone: the default drafting beside `--no-draft` with 1, 2 and 4 clients at once, on
generated pairs where drafting seldom or never pays.

- `tiny`: a 2-layer model of width 64 alone (a step of ~0.1–0.3 ms: choosing costs about what a step does);
- `twin`: that model drafting for itself (every draft kept, but a draft step costs a target step);
- `wide`: a 12-layer model of width 512 (a step of a few ms) with a draft cut from its first 2 layers;
- `mtp`: a Qwen3.5-style model of width 512 and 8 layers (~2 ms a step) whose MTP head is random (its drafts are
  seldom kept).

Each runs `spec bench --concurrency 1,2,4 --modes hybrid` (the default and the target alone side by side, each
batch every built-in prompt once, sent by the clients back to back, from an empty memory of earlier outputs) and
the ratios are gathered in one table; `--json` keeps them. The models have no end-of-generation token they emit,
so every request runs its full length.

    python benchmarks/never_behind.py [--only tiny,twin,wide,mtp] [-n 256] [-r 10] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from support.tiny_models import write_model, write_qwen35_mtp  # noqa: E402  (the test suite's GGUF writers)

from spec_cli.cli.app import app  # noqa: E402
from spec_cli.llama import kernels  # noqa: E402

LEVELS = "1,2,4"


def models(folder: Path) -> dict[str, tuple[Path, Path | None]]:
    """The pairs, written once into `folder`: (target, draft or None)."""
    tiny = folder / "tiny-64x2.gguf"
    wide = folder / "wide-512x12.gguf"
    cut = folder / "wide-512x2.gguf"
    mtp = folder / "mtp-512x8.gguf"
    if not tiny.exists():
        write_model(tiny, 1, eos=1)
    if not wide.exists():
        write_model(wide, 3, eos=1, n_embd=512, n_layer=12, layer_scale=0.05)
    if not cut.exists():
        write_model(cut, 3, eos=1, n_embd=512, n_layer=12, layer_scale=0.05, kept_layers=2)
    if not mtp.exists():
        write_qwen35_mtp(mtp, 3, n_embd=512, n_trunk=8, head_noise=8.0, eos=1)
    return {"tiny": (tiny, None), "twin": (tiny, tiny), "wide": (wide, cut), "mtp": (mtp, None)}


def ratios(report: Path) -> dict[int, float]:
    """The default's tokens per second over the target alone's, by clients at once, from a `--json` report."""
    levels = json.loads(report.read_text())["concurrency"]
    return {level["concurrency"]: next(side["speedup"] for side in level["sides"] if side["draft_mode"] == "hybrid")
            for level in levels}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "spec-never-behind")
    parser.add_argument("--only", default="tiny,twin,wide,mtp", help="which pairs, comma-separated")
    parser.add_argument("-n", type=int, default=256, help="tokens per request")
    parser.add_argument("-r", type=int, default=10, help="batches of each side at each level")
    parser.add_argument("--json", type=Path, help="also write the ratios here")
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    pairs = models(args.dir)
    table: dict[str, dict[int, float]] = {}
    for name in args.only.split(","):
        target, draft = pairs[name]
        report = args.dir / f"{name}.json"
        options = ["bench", "--target", str(target), *(["--draft", str(draft)] if draft else []), "--ctx", "512",
                   "--concurrency", LEVELS, "--modes", "hybrid", "-n", str(args.n), "-r", str(args.r),
                   "--json", str(report)]
        try:
            app(options)
        except SystemExit as done:
            if done.code:
                raise
        table[name] = ratios(report)
    print(f"\nthe default over the target alone ({kernels.cpu_name()}), clients at once {LEVELS}:")
    for name, by_level in table.items():
        print(f"  {name:5} " + "  ".join(f"{level}: {ratio:.2f}x" for level, ratio in sorted(by_level.items())))
    if args.json:
        args.json.write_text(json.dumps({"cpu": kernels.cpu_name(), "ratios": table}, indent=2) + "\n")


if __name__ == "__main__":
    main()
