#!/usr/bin/env bash
# Install spec-cli into .venv, with llama-cpp-python built for this machine: CUDA where an NVIDIA driver is
# present, Metal on Apple Silicon, the CPU otherwise, always with llama.cpp's RPC backend (spec worker, --rpc).
#
#   ./install.sh             spec-cli itself; then: .venv/bin/spec run "…"
#   ./install.sh --test      editable, with the test dependencies; then: .venv/bin/pytest
#   ./install.sh --dry-run   say which backend would be built, and stop
#
# CMAKE_ARGS set by you wins. pip keeps the wheels it builds without looking at CMAKE_ARGS, so a wheel built
# earlier for another backend would be reused silently: the build is checked, and rebuilt when it lacks what
# was asked for. The first build takes about 8 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")"

LLAMA_CPP_PYTHON="llama-cpp-python==0.3.36"
editable=""  # a string, not an array: macOS bash 3.2 with set -u rejects an empty one
spec="."
dry_run=false
case "${1:-}" in
  "") ;;
  --test) editable="-e"; spec=".[test]" ;;
  --dry-run) dry_run=true ;;
  -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "install.sh: unknown option '$1' (try --test, --dry-run or --help)" >&2; exit 2 ;;
esac

if [ -n "${CMAKE_ARGS:-}" ]; then
  backend="your CMAKE_ARGS"
elif command -v nvidia-smi >/dev/null 2>&1 || [ -e /proc/driver/nvidia ]; then
  backend="CUDA"; export CMAKE_ARGS="-DGGML_CUDA=on -DGGML_RPC=on"
elif [ "$(uname -s)" = "Darwin" ] && [ "$(uname -m)" = "arm64" ]; then
  backend="Metal"; export CMAKE_ARGS="-DGGML_METAL=on -DGGML_RPC=on"
else
  backend="CPU"; export CMAKE_ARGS="-DGGML_RPC=on"
fi
if $dry_run; then
  echo "install.sh: would build llama-cpp-python for ${backend}: CMAKE_ARGS=\"${CMAKE_ARGS}\""
  exit 0
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
python=.venv/bin/python
"$python" -m pip install $editable "$spec"
if [ -n "$editable" ]; then
  # pip byte-compiles what it installs, but an editable install imports spec_cli from this folder: where Python
  # may not write bytecode (PYTHONDONTWRITEBYTECODE), every process would compile it again (~0.3 s each).
  "$python" -m compileall -q spec_cli
fi

# What the installed build lacks of what CMAKE_ARGS asked for (nothing: empty).
missing() {
  "$python" - "$CMAKE_ARGS" <<'EOF'
import sys

import llama_cpp

from spec_cli.llama.model import supports_gpu_offload

asked = sys.argv[1]
lacks = []
if "-DGGML_RPC=on" in asked and not llama_cpp.llama_supports_rpc():
    lacks.append("RPC")
if ("-DGGML_CUDA=on" in asked or "-DGGML_METAL=on" in asked) and not supports_gpu_offload():
    lacks.append("the GPU")
print(" and ".join(lacks))
EOF
}

lacking="$(missing)"
if [ -n "$lacking" ]; then
  echo "install.sh: the llama-cpp-python wheel pip reused lacks ${lacking}; building it again for ${backend}"
  "$python" -m pip cache remove llama_cpp_python >/dev/null 2>&1 || true
  "$python" -m pip install --force-reinstall --no-deps --no-cache-dir "$LLAMA_CPP_PYTHON"
  lacking="$(missing)"
  if [ -n "$lacking" ]; then
    echo "install.sh: llama-cpp-python built with CMAKE_ARGS=\"${CMAKE_ARGS}\" still lacks ${lacking}" >&2
    exit 1
  fi
fi
"$python" - "$backend" <<'EOF'
import sys

import llama_cpp

from spec_cli.reports.models import backends

llama_cpp.llama_backend_init()
info = llama_cpp.llama_print_system_info().decode("utf-8", errors="replace")
rpc = "with RPC" if llama_cpp.llama_supports_rpc() else "without RPC"
print(f"install.sh: llama-cpp-python {llama_cpp.__version__} for {sys.argv[1]}: backends "
      f"{', '.join(backends(info))}, {rpc}")
EOF
