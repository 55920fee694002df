"""The tests' generated vision pairs through llama.cpp's own multimodal tool: its greedy answer to two images and a
question, byte for byte against spec's, the target alone and drafted (a draft with its own mmproj), for a Qwen2-VL
merger (M-RoPE) and a LLaVA-1.5 projector (positions by token count).

llama-mtmd-cli is built from the vendored llama.cpp of the pinned llama-cpp-python (~10 min on 2 cores):

    pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 && tar xzf llama_cpp_python-0.3.36.tar.gz
    cmake -S llama_cpp_python-0.3.36/vendor/llama.cpp -B build -DLLAMA_BUILD_TOOLS=ON -DLLAMA_CURL=OFF \\
        -DLLAMA_OPENSSL=OFF && cmake --build build --target llama-mtmd-cli -j2
    python benchmarks/images_vs_llama_mtmd.py build/bin/llama-mtmd-cli
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from spec_cli import SamplingParams, load_pair
from spec_cli.llama.prompt_text import IMAGE_MARKER
from spec_cli.llama.vision import read_image

QUESTION = "say what you see"
N = 24


def write_pairs(folder: Path) -> dict[str, tuple[Path, Path, Path]]:
    """(target, draft, mmproj) of each projector, and the two images, as the tests write them."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from support.tiny_models import CHAT_TEMPLATE, N_EMBD, write_model
    from support.tiny_vision import png, write_mmproj
    (folder / "wide.png").write_bytes(png(24, 16, seed=1))
    (folder / "square.png").write_bytes(png(16, 16, seed=2))
    return {arch: (write_model(folder / f"{arch}.gguf", 1, arch=arch, chat_template=CHAT_TEMPLATE),
                   write_model(folder / f"{arch}-draft.gguf", 1, arch=arch, noise=0.05),
                   write_mmproj(folder / f"{arch}-mmproj.gguf", 3, text_width=N_EMBD, projector=projector))
            for arch, projector in (("qwen2vl", "qwen2vl_merger"), ("llama", "mlp"))}


def spec_answers(target: Path, draft: Path, mmproj: Path, images: list[Path]) -> dict[str, tuple[bytes, str]]:
    """spec's greedy answer bytes, the target alone and drafted, with the drafting figures; the prompt as
    llama-mtmd-cli writes it (a marker per image before the question, the chat template around them)."""
    answers = {}
    with load_pair(target, draft, mmproj=mmproj, draft_mmproj=mmproj, n_ctx=512) as pair:
        pieces = pair.see([read_image(path) for path in images])
        prompt = pair.target.tokenize_prompt(pair.target.format_chat(
            [{"role": "user", "content": IMAGE_MARKER * len(images) + QUESTION}]), images=pieces)
        for mode in ("none", "model"):
            generation = pair.generate(prompt, sampling=SamplingParams(), max_tokens=N, draft_mode=mode, draft_max=3)
            for _ in generation:
                pass
            answer = b"".join(pair.target.piece(token) for token in generation.token_ids)
            answers[mode] = (answer, f"{generation.stats.accepted}/{generation.stats.drafted} drafts kept")
    return answers


def tool_answer(tool: Path, target: Path, mmproj: Path, images: list[Path]) -> bytes:
    done = subprocess.run([str(tool), "-m", str(target), "--mmproj", str(mmproj), "--image",
                           ",".join(str(path) for path in images), "-p", QUESTION, "--temp", "0", "--top-k", "1",
                           "-n", str(N), "-c", "512", "--no-warmup", "-t", "2", "--jinja"],
                          capture_output=True, check=True, timeout=300)
    return done.stdout.strip(b"\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tool", type=Path, help="llama-mtmd-cli")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        pairs = write_pairs(folder)
        images = [folder / "wide.png", folder / "square.png"]
        for arch, (target, draft, mmproj) in pairs.items():
            theirs = tool_answer(args.tool, target, mmproj, images)
            for mode, (ours, figures) in spec_answers(target, draft, mmproj, images).items():
                way = "target alone" if mode == "none" else f"drafted ({figures})"
                print(f"{arch:8} spec {way:28} {'the same bytes' if ours == theirs else 'DIFFERENT'} as "
                      f"llama-mtmd-cli ({len(theirs)} bytes)")


if __name__ == "__main__":
    main()
