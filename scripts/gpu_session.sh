#!/usr/bin/env bash
# The GPU work of a short loan of a GPU machine (15 minutes in all, at most 10 a command, 64 MiB carried a call with
# the checkout, no network there, given back after 30 s idle): three calls, back to back.
#
# It lives in scripts/, outside the package: a developer's tool for a lent machine, shell around `aiayn` and pytest,
# neither shipped nor run by CI.
#
#   scripts/gpu_session.sh pack [SM] [BASELINE]
#                                      here, on a machine with the Python package index: .gpu/ (ignored by git) gets
#                                      the test set, BASELINE's aiayn (a commit, default HEAD: the engine to measure
#                                      against) and two xz archives for the GPU machine's Python 3.12, cut into
#                                      pieces that fit a call beside the checkout: ONNX Runtime for CUDA (its cubins
#                                      for sm_SM only, default 90: H100, H200) with sentencex, then CTranslate2
#   scripts/gpu_session.sh receive     there: keeps the pieces of this call in /tmp while the machine stays warm
#   scripts/gpu_session.sh cuda        there, stage 1 (≤ 5 min): ONNX Runtime installed; the serving engine's tests of
#                                      tests/cuda (fp32 against the CPU engines on 200 test sentences, fp16 on all
#                                      1000, greedy and beam 4, its self-check); scripts/cuda_graph_probe.py: a step
#                                      launched, captured and replayed
#   scripts/gpu_session.sh bench       there, stage 2 (≤ 8 min): CTranslate2 installed; `aiayn bench --device cuda
#                                      --quick --baseline`, ours against CTranslate2 and BASELINE's engine with GPU
#                                      memory, 3 rounds; the GPU memory by part at the base size
#
# DRY_RUN=1 runs a stage here on the CPU (the venv's packages, the archives tested instead of installed, 5
# sentences, the CUDA graphs on the CPU provider under CUDA's binding rules: tests/conftest.py), to prove the script
# before GPU minutes are spent on it.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
DRY_RUN=${DRY_RUN:-0}
PYTHON=${PYTHON:-python3}  # on the GPU machine: its python3, the one with PyTorch (CUDA 13) in it
OUT=${OUT:-$REPO/.gpu/out}  # set by the machine's tool there; what is written under it comes back
GPU=$REPO/.gpu
PIECES=/tmp/aiayn-pieces  # where the pieces wait on the machine between calls
SITE=/tmp/site  # the carried packages, ahead of the machine's own (its onnxruntime is the CPU build)
PIECE_MIB=30  # the checkout (~29 MiB) + .gpu/base + one piece stay under a call's 64 MiB

ORT_WHEEL="onnxruntime-gpu==1.31.1"  # built for CUDA 13 (libcublasLt.so.13), as the machine's PyTorch is
CT2_WHEEL="ctranslate2==4.8.5"
SENTENCEX_WHEEL="sentencex==1.0.32"
PIP_TARGET_FLAGS=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
  --platform manylinux2014_x86_64)

if [[ $DRY_RUN == 1 ]]; then
  DEVICE=cpu
  SENTENCES=5
else
  DEVICE=cuda
fi
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 GRADIO_ANALYTICS_ENABLED=False
export AIAYN_DATA=${AIAYN_DATA:-$GPU/base/multi30k}

aiayn() { "$PYTHON" -m aiayn.cli "$@"; }

# One xz archive of the packages in $1 (a folder) named $2..., for the GPU machine.
archive() {
  local from=$1 name=$2
  shift 2
  tar -C "$from" -cf - "$@" | xz -9e -T0 >"$GPU/$name.tar.xz"
}

pack() {
  local sm=${1:-90} baseline=${2:-HEAD} corpus=$REPO/../shared/data/multi30k tmp
  tmp=$(mktemp -d)
  rm -rf "$GPU" && mkdir -p "$GPU/base/multi30k" "$GPU/base/baseline" "$tmp/site"
  cp "$corpus"/test_2016_flickr.{en,de}.gz "$GPU/base/multi30k/"
  git -C "$REPO" archive "$baseline" aiayn | tar -x -C "$GPU/base/baseline"
  "$PYTHON" -m pip download -q "${PIP_TARGET_FLAGS[@]}" -d "$tmp/wheels" "$ORT_WHEEL" "$CT2_WHEEL" "$SENTENCEX_WHEEL"
  for wheel in "$tmp"/wheels/*.whl; do unzip -q -o "$wheel" -d "$tmp/site"; done
  local ort=$tmp/site/onnxruntime
  # What the tests never load: the C API library (the Python module links ONNX Runtime in), TensorRT's provider,
  # the quantization and model tools (onnxruntime.transformers stays: the fp16 export uses it).
  rm -rf "$ort"/capi/libonnxruntime.so.* "$ort"/capi/libonnxruntime_providers_tensorrt.so "$ort"/quantization \
    "$ort"/tools
  "$PYTHON" "$REPO/scripts/prune_cubins.py" "$ort/capi/libonnxruntime_providers_cuda.so" "$sm"
  (cd "$tmp/site" && ls -d onnxruntime* sentencex* >"$tmp/ort.list" && ls -d ctranslate2* >"$tmp/ct2.list")
  # shellcheck disable=SC2046  # the names are words
  archive "$tmp/site" ort $(cat "$tmp/ort.list")
  # shellcheck disable=SC2046
  archive "$tmp/site" ct2 $(cat "$tmp/ct2.list")
  (cd "$GPU" && sha256sum ort.tar.xz ct2.tar.xz >base/archives.sha256)
  split -b "${PIECE_MIB}M" -d -a 2 "$GPU/ort.tar.xz" "$GPU/ort.tar.xz."
  rm "$GPU/ort.tar.xz"
  for piece in "$GPU"/ort.tar.xz.* "$GPU/ct2.tar.xz"; do
    local n
    n=$(find "$GPU" -maxdepth 1 -name 'p[0-9][0-9]' | wc -l)
    mkdir -p "$GPU/p0$n" && mv "$piece" "$GPU/p0$n/"
  done
  rm -rf "$tmp"
  local pieces=("$GPU"/p[0-9][0-9]) last
  last=$(basename "${pieces[-1]}")
  echo "packed: .gpu/base ($(du -sh "$GPU/base" | cut -f1)); pieces: $(cd "$GPU" && du -sh p[0-9][0-9]/* | tr '\n' ' ')"
  echo "the calls, back to back (the machine keeps the pieces only while warm, 30 s):"
  echo "  run(command='scripts/gpu_session.sh receive', carry=['.gpu/base', '.gpu/p00'], timeout_s=120)"
  for piece in "${pieces[@]:1:${#pieces[@]}-2}"; do
    echo "  run(command='scripts/gpu_session.sh cuda', carry=['.gpu/base', '.gpu/$(basename "$piece")'], timeout_s=360)"
  done
  echo "  run(command='scripts/gpu_session.sh bench', carry=['.gpu/base', '.gpu/$last'], timeout_s=540)"
}

receive() {
  mkdir -p "$PIECES"
  find "$GPU" -path "$GPU/p[0-9][0-9]/*" -type f -exec cp {} "$PIECES/" \;
  echo "pieces here: $(ls "$PIECES" | tr '\n' ' ')"
}

# The archive $1 (ort or ct2) joined from its pieces, checked against pack's checksum, and unpacked into $SITE.
unpack() {
  local name=$1 joined=/tmp/$1.tar.xz
  receive
  cat "$PIECES/$name".tar.xz* >"$joined"
  (cd /tmp && grep " $name.tar.xz" "$GPU/base/archives.sha256" | sha256sum -c --quiet) || {
    echo "$name: the pieces here do not make pack's archive (a piece missing or from another pack): carry them again" >&2
    exit 1
  }
  if [[ $DRY_RUN == 1 ]]; then
    xz -t "$joined" && echo "dry run: $name archive whole; not installed (the venv's packages run)"
    return
  fi
  # Python's own xz reader: the machine's image need not have the xz command
  "$PYTHON" -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter="tar")' "$joined" "$SITE"
}

# CUDA's libraries from the machine's own nvidia-* packages (those PyTorch uses), where ONNX Runtime and
# CTranslate2 look for them; CTranslate2 4.8.5 asks for libcublas.so.12 where the machine has CUDA 13's .so.13.
use_site() {
  export PYTHONPATH=$REPO:$SITE${PYTHONPATH:+:$PYTHONPATH}
  [[ $DRY_RUN == 1 ]] && return
  local libs cublas
  libs=$("$PYTHON" -c 'import nvidia; print(" ".join(nvidia.__path__))' | xargs -I{} find {} -name 'lib*.so*' \
    -printf '%h\n' | sort -u | paste -sd:) || true
  cublas=$(tr ':' '\n' <<<"$libs" | while read -r dir; do ls "$dir"/libcublas.so.13 2>/dev/null || true; done | head -1)
  if [[ -n $cublas ]]; then
    mkdir -p /tmp/cublas12 && ln -sf "$cublas" /tmp/cublas12/libcublas.so.12
    libs=/tmp/cublas12:$libs
  fi
  export LD_LIBRARY_PATH=$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
}

probe() {
  {
    date -u
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 || echo "no nvidia-smi"
    "$PYTHON" -c 'import sys, onnxruntime as ort
print(sys.version.split()[0], "onnxruntime", ort.__version__, ort.__file__, ort.get_available_providers())'
  } 2>&1 | tee -a "$OUT/machine.txt"
}

cuda() {
  unpack ort
  use_site
  probe
  # tests/cuda's serving-engine tests: its fp32 lines against both CPU engines and its self-check on the first 200
  # test sentences, its fp16 lines and BLEU against CPU fp32 on all 1000 (the contract graphs' tests on CUDA are the
  # portable engine's, unchanged by the captured step: left out of a 15-minute loan).
  local part sentences
  for part in "serving and not fp16 and not page:200" "serving and fp16:1000"; do
    sentences=${part##*:}
    [[ $DRY_RUN == 1 ]] && sentences=$SENTENCES
    AIAYN_CUDA_TESTS_DEVICE=$DEVICE AIAYN_CUDA_TESTS_SENTENCES=$sentences \
      AIAYN_CUDA_TESTS_RESULTS=$OUT/cuda_tests.jsonl timeout 200 "$PYTHON" -m pytest -m cuda tests/cuda -q -rA \
      -p no:cacheprovider -k "${part%:*}" 2>&1 | tee -a "$OUT/cuda_tests.log" | tail -12 || true
  done
  # A step launched kernel by kernel, captured, and replayed: bundled and base size, fp32 and fp16, 1 and 128 rows.
  timeout 120 "$PYTHON" scripts/cuda_graph_probe.py --device "$DEVICE" 2>&1 | tee "$OUT/probe.jsonl" || true
}

bench() {
  unpack ct2
  use_site
  # Ours against CTranslate2 and the baseline's engine on the same GPU: greedy b1/b32/b128, beam 4 b32/b128, fp32 and
  # fp16, the bundled model and the base size, each engine's GPU memory; engines in processes of their own,
  # interleaved round by round.
  if [[ $DRY_RUN == 1 ]]; then  # the same bench code, its framing on the CPU at a tiny size: the test that proves it
    "$PYTHON" -m pytest -q -p no:cacheprovider tests/bench/test_base_size_bench.py -k gpu_rows 2>&1 |
      tee "$OUT/bench_cuda.txt" | tail -3
  else
    timeout 420 "$PYTHON" -m aiayn.cli bench --device cuda --quick --baseline "$GPU/base/baseline" \
      --json "$OUT/bench_cuda.json" 2>&1 | tee "$OUT/bench_cuda.txt" | tail -40 || echo "bench: exit $?"
  fi
  # The GPU memory by part at the base size after beam 4 over 128 sentences, each variant in a fresh process.
  for variant in fp32 fp16; do
    timeout 60 "$PYTHON" scripts/cuda_graph_probe.py --device "$DEVICE" --memory "$variant" 2>&1 |
      tee -a "$OUT/probe.jsonl" || true
  done
}

case ${1:-} in
  pack) pack "${2:-}" ;;
  receive) receive ;;
  cuda) cuda ;;
  bench) bench ;;
  *)
    echo "usage: [DRY_RUN=1] scripts/gpu_session.sh pack [SM] | receive | cuda | bench" >&2
    exit 2
    ;;
esac
