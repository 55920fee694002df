"""A draft that reads the text around an image against a draft that sees the image too, on image-grounded
prompts, side by side in one run: acceptance and tokens per second of each, and of the target alone, greedy,
fixed K, every answer checked against the target alone's (up to a float tie, `decoding.ties`).

On a real pair (a vision target with its mmproj, a draft of its family with its own):

    python benchmarks/images.py --pair smolvlm2-2.2b --image photo.jpg --image chart.png
    python benchmarks/images.py --target T.gguf --mmproj T-mmproj.gguf --draft D.gguf --draft-mmproj D-mmproj.gguf \\
        --image photo.jpg

With no files (`--tiny`), it writes the tests' generated Qwen2-VL pair and noise images: that shows only that both
ways run and stay exact; random weights say nothing about how much seeing the image helps a real draft.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from spec_cli import SamplingParams
from spec_cli.cli.options import LoadOptions, open_pair
from spec_cli.bench.ties import first_difference
from spec_cli.llama.vision import read_image

QUESTIONS = ["Describe this image in detail.", "What colours are in this image?", "List every object you can see.",
             "Write a caption for this image.", "What is happening in this picture?"]


def tiny_files(folder: Path) -> dict[str, Path]:
    """The tests' generated vision pair: a Qwen2-VL target, a noisy copy as draft, one projector, two images."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from support.tiny_models import CHAT_TEMPLATE, N_EMBD, write_model
    from support.tiny_vision import png, write_mmproj
    files = {"target": write_model(folder / "target.gguf", 1, arch="qwen2vl", chat_template=CHAT_TEMPLATE),
             "draft": write_model(folder / "draft.gguf", 1, arch="qwen2vl", noise=0.05),
             "mmproj": write_mmproj(folder / "mmproj.gguf", 3, text_width=N_EMBD)}
    for i, size in enumerate(((48, 32), (32, 32))):
        files[f"image{i}"] = folder / f"image{i}.png"
        files[f"image{i}"].write_bytes(png(*size, seed=i))
    return files


def measure(options: LoadOptions, images: list[Path], n: int, k: int) -> dict[str, tuple[float, float, int]]:
    """Per way (target alone, draft that sees the image, draft that reads the text around it): (tokens per second,
    acceptance, answers that differ from the target alone's other than at a float tie). The text-only way is the
    same draft with its projector taken away (its context skips the images, as one without an mmproj does)."""
    pictures = [read_image(path) for path in images]
    with open_pair(options) as loaded:
        pair = loaded.pair
        prompts = [pair.prompt_tokens(q, raw=not pair.has_chat_template, images=[p]) for q in QUESTIONS
                   for p in pictures]
        reference = [_run(pair, prompt, n, "none", 0) for prompt in prompts]
        results = {"target alone": _summary(reference, reference, pair, prompts)}
        if pair.draft_vision is not None:
            results["draft sees the image"] = _summary([_run(pair, p, n, "model", k) for p in prompts], reference,
                                                       pair, prompts)
            pair.draft_context.trim(0)
            pair.draft_context.projector = None
        results["draft reads the text around it"] = _summary([_run(pair, p, n, "model", k) for p in prompts],
                                                             reference, pair, prompts)
    return results


def _run(pair, prompt: list[int], n: int, mode: str, k: int):  # noqa: ANN001, ANN202 (a benchmark's helper)
    generation = pair.generate(prompt, sampling=SamplingParams(), max_tokens=n, draft_mode=mode, draft_max=k)
    started = time.perf_counter()
    for _ in generation:
        pass
    return generation, time.perf_counter() - started


def _summary(runs, reference, pair, prompts) -> tuple[float, float, int]:  # noqa: ANN001
    tokens = sum(len(g.token_ids) for g, _ in runs)
    seconds = sum(s for _, s in runs)
    drafted = sum(g.stats.drafted for g, _ in runs)
    accepted = sum(g.stats.accepted for g, _ in runs)
    wrong = 0
    for (ours, _), (alone, _), prompt in zip(runs, reference, prompts):
        difference = first_difference(pair.target, prompt, ours.token_ids, alone.token_ids, projector=pair.vision)
        wrong += difference is not None and not difference.tie
    return tokens / seconds, accepted / drafted if drafted else 0.0, wrong


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pair")
    parser.add_argument("--target", type=Path)
    parser.add_argument("--draft", type=Path)
    parser.add_argument("--mmproj", type=Path)
    parser.add_argument("--draft-mmproj", type=Path)
    parser.add_argument("--image", type=Path, action="append", default=[])
    parser.add_argument("--tiny", action="store_true", help="the tests' generated pair and images")
    parser.add_argument("-n", type=int, default=64)
    parser.add_argument("-k", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        if args.tiny:
            files = tiny_files(Path(folder))
            options = LoadOptions(target=files["target"], draft=files["draft"], mmproj=files["mmproj"],
                                  draft_mmproj=files["mmproj"], quiet=True, max_draft=args.k)
            images = [files["image0"], files["image1"]]
        else:
            options = LoadOptions(target=args.target, draft=args.draft, pair=args.pair, mmproj=args.mmproj,
                                  draft_mmproj=args.draft_mmproj, quiet=True, max_draft=args.k)
            images = args.image
        if not images:
            raise SystemExit("give --image FILE (one or more), or --tiny")
        print(f"{len(QUESTIONS) * len(images)} image-grounded prompts, {args.n} tokens each, greedy, K = {args.k}")
        for way, (speed, acceptance, wrong) in measure(options, images, args.n, args.k).items():
            print(f"{way:32} {speed:8.1f} tok/s   acceptance {acceptance:6.1%}   "
                  f"answers other than the target alone's: {wrong}")


if __name__ == "__main__":
    main()
