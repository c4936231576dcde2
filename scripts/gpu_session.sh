#!/usr/bin/env bash
# The GPU work in few `device` calls: issue #39's proofs and figures (`cuda`: docs/serve.md, "On a GPU"), and issue
# #24's training runs (`train`).
#
# It lives in scripts/, outside the package: it is a developer's tool for a lent machine, shell around
# `aiayn` and pytest, neither shipped nor run by CI.
#
#   scripts/gpu_session.sh pack      here, on a machine with PyPI: .gpu/ (ignored by git) gets the corpus and
#                                    every wheel the GPU machine lacks, cut into pieces that fit a call
#   scripts/gpu_session.sh train     there: several en→de configurations trained at once, then scored on val
#   scripts/gpu_session.sh receive   there: a call that only brings a piece (lists what has arrived)
#   scripts/gpu_session.sh cuda      there: the pieces joined and installed, tests/cuda (the serving engine on CUDA
#                                    against the CPU engines), then `aiayn bench --device cuda --quick` (ours against
#                                    CTranslate2 on the GPU: the bundled model and the base size, with GPU memory)
#
# The GPU machine reaches no network, and a call takes at most 64 MiB of working tree: the checkout itself
# (about 28 MiB, the bundled models) plus what `carry` names. onnxruntime-gpu alone is a 256 MB wheel, so
# the wheels travel as pieces of PIECE_MIB, one per call, and wait in .gpu/ on the machine while it stays
# warm (30 s after a call: make the calls back to back). `pack` prints the calls.
#
# DRY_RUN=1 runs a stage here on the CPU, everything shrunk (a few steps on 200 pairs, 5 sentences, the
# CPU device, the wheels checked instead of installed), to prove the script before GPU minutes are spent.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
DRY_RUN=${DRY_RUN:-0}
PYTHON=${PYTHON:-python3}  # on the GPU machine: its python3, the one with PyTorch (CUDA 13) in it
OUT=${OUT:-$REPO/.gpu/out}  # set by the device tool there; what is written under it comes back
GPU=$REPO/.gpu
PIECE_MIB=31  # checkout (~28 MiB) + .gpu/base (~4 MiB) + one piece stays under a call's 64 MiB
SRC=${SRC:-en}
TGT=${TGT:-de}
TRAIN_MINUTES=${TRAIN_MINUTES:-6}  # per run; then averaging, calibration and val scoring fit one 10-minute call

ORT_WHEEL="onnxruntime-gpu==1.31.1"  # built for CUDA 13 (libcublasLt.so.13), as the machine's PyTorch is
PAGE_WHEELS=("gradio==6.31.0" "gradio_client==2.7.2" "sentencex==1.0.32" "ctranslate2==4.8.5")
# What the GPU machine's python3 already has (/work/.library/device/KINDS.md, read 2026-11-17) among the
# dependencies of the wheels above: not carried.
DEVICE_HAS="annotated-doc anyio certifi click filelock fsspec h11 hf-xet httpcore httpx huggingface-hub idna jinja2
markdown-it-py markupsafe mdurl numpy packaging pandas pillow pygments python-dateutil pyyaml rich shellingham tqdm
typer typing-extensions"
PIP_TARGET_FLAGS=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
  --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
  --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64)

if [[ $DRY_RUN == 1 ]]; then
  DEVICE=cpu
  SENTENCES=5
else
  DEVICE=cuda
  SENTENCES=1000
fi
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 GRADIO_ANALYTICS_ENABLED=False
export AIAYN_DATA=${AIAYN_DATA:-$GPU/base/multi30k}

aiayn() { "$PYTHON" -m aiayn.cli "$@"; }

# The wheels go to /tmp/site, ahead of the machine's own packages (its onnxruntime is the CPU build).
use_site() {
  export PYTHONPATH=$REPO:/tmp/site${PYTHONPATH:+:$PYTHONPATH}
}

pack() {
  local corpus=${1:-$REPO/../shared/data/multi30k} tmp
  tmp=$(mktemp -d)
  rm -rf "$GPU/base" "$GPU"/p[0-9][0-9]
  mkdir -p "$GPU/base/wheels" "$tmp/wheels"
  cp -r "$corpus" "$GPU/base/multi30k"
  "$PYTHON" -m pip download -q "${PIP_TARGET_FLAGS[@]}" -d "$tmp/all" "$ORT_WHEEL" "${PAGE_WHEELS[@]}"
  for wheel in "$tmp"/all/*.whl; do
    local name
    name=$(basename "$wheel" | sed -E 's/-[0-9].*//' | tr 'A-Z_' 'a-z-')
    if [[ $name == sentencex ]]; then
      mv "$wheel" "$GPU/base/wheels/"  # training needs it: it travels with the corpus, in the first call
    elif ! grep -qw -- "$name" <<<"$DEVICE_HAS"; then
      mv "$wheel" "$tmp/wheels/"
    fi
  done
  tar -cf "$tmp/payload.tar" -C "$tmp" wheels  # wheels are zip-compressed already
  (cd "$tmp" && sha256sum payload.tar) >"$GPU/base/payload.sha256"
  split -b "${PIECE_MIB}M" -d -a 2 "$tmp/payload.tar" "$tmp/piece."
  for piece in "$tmp"/piece.*; do
    mkdir -p "$GPU/p${piece##*.}" && mv "$piece" "$GPU/p${piece##*.}/piece"
  done
  rm -rf "$tmp"
  local pieces=("$GPU"/p[0-9][0-9]) last
  (cd "$GPU" && ls -d p[0-9][0-9]) >"$GPU/base/pieces"
  last=$(basename "${pieces[-1]}")
  echo "packed: .gpu/base ($(du -sh "$GPU/base" | cut -f1)) and ${#pieces[@]} pieces of ${PIECE_MIB} MiB"
  echo "device calls, back to back (the machine keeps .gpu/ only while warm, 30 s):"
  echo "  run(command='scripts/gpu_session.sh receive', carry=['.gpu/base', '.gpu/p00'], timeout_s=120)"
  echo "    (or, for issue #24's training runs first: command='scripts/gpu_session.sh train', timeout_s=600)"
  for piece in "${pieces[@]:1:${#pieces[@]}-2}"; do
    echo "  run(command='scripts/gpu_session.sh receive', carry=['.gpu/$(basename "$piece")'], timeout_s=120)"
  done
  echo "  run(command='scripts/gpu_session.sh cuda', carry=['.gpu/base', '.gpu/$last'], timeout_s=600)"
  echo "(a machine given back between calls forgets the pieces: \`cuda\` names the missing ones; carry them again)"
}

receive() {
  ls "$GPU" | tr '\n' ' '
  echo
}

install_base() {
  use_site
  if [[ $DRY_RUN == 1 ]]; then
    return  # here the venv has every package; the wheels are for CPython 3.12
  fi
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "$GPU"/base/wheels/*.whl
}

# The pieces joined, checked against pack's checksum, and installed into /tmp/site; CUDA's libraries from
# the machine's own nvidia-* packages (those PyTorch uses), where ONNX Runtime looks for them.
install_all() {
  install_base
  local tmp=/tmp/aiayn-payload
  rm -rf "$tmp" && mkdir -p "$tmp"
  local missing
  missing=$(cd "$GPU" && while read -r piece; do [[ -f $piece/piece ]] || echo -n "$piece "; done <base/pieces)
  if [[ -n $missing ]]; then
    echo "pieces missing here (the machine was given back since they came?): $missing; carry them again" >&2
    exit 1
  fi
  cat "$GPU"/p[0-9][0-9]/piece >"$tmp/payload.tar"
  (cd "$tmp" && sha256sum -c "$GPU/base/payload.sha256") || {
    echo "the joined pieces do not match the checksum of pack; run pack again and carry every piece" >&2
    exit 1
  }
  tar -xf "$tmp/payload.tar" -C "$tmp"
  if [[ $DRY_RUN == 1 ]]; then
    for wheel in "$tmp"/wheels/*.whl; do unzip -tq "$wheel" >/dev/null; done
    echo "dry run: $(ls "$tmp"/wheels | wc -l) wheels joined, checksum and archives good; not installed"
    return
  fi
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "$tmp"/wheels/*.whl
  local libs
  libs=$("$PYTHON" -c 'import nvidia; print(" ".join(nvidia.__path__))' | xargs -n1 -I{} find {} -name 'lib*.so*' \
    -printf '%h\n' | sort -u | paste -sd:) || true
  # CTranslate2 4.8.5 asks for libcublas.so.12 where the machine has CUDA 13's libcublas.so.13: a link by the old
  # name let it run on the lent H100 (its figures say so beside them).
  local cublas
  cublas=$(tr ':' '\n' <<<"$libs" | while read -r dir; do ls "$dir"/libcublas.so.13 2>/dev/null; done | head -1)
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
    "$PYTHON" -c 'import sys, torch, onnxruntime as ort
print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.cuda.is_available())
print("onnxruntime", ort.__version__, ort.__file__, ort.get_available_providers())'
  } 2>&1 | tee -a "$OUT/machine.txt"
}

# The configurations trained at once, one process each on the one GPU: NAME then its flags.
train_configs() {
  cat <<EOF
tiny-avg8 --average-last 8
tiny-attn-act-drop --set attention_dropout=0.1 --set activation_dropout=0.1 --average-last 8
d256-drop04 --set d_model=256 --set d_ff=512 --set dropout=0.4 --set attention_dropout=0.1 --average-last 8
bundled-longer --init-from $SRC-$TGT --set attention_dropout=0.1 --set activation_dropout=0.1 --average-last 10
EOF
}

train() {
  install_base
  probe
  local runs=/tmp/aiayn-runs logs=$OUT/train-logs corpus_flags=() limit_flags=(--time-limit "$TRAIN_MINUTES")
  # Scored by the CPU serving engine (the machine's own onnxruntime), leaving the GPU to the training runs.
  local eval_flags=(--engine onnx --device cpu)
  rm -rf "$runs" && mkdir -p "$runs" "$logs"
  if [[ $DRY_RUN == 1 ]]; then  # 200 pairs, 2 epochs, 5 validation pairs
    "$PYTHON" - "$runs" <<'EOF'
import sys
from aiayn.data.multi30k import load_parallel
for split, n, name in (("train", 200, "train"), ("val", 5, "valid")):
    corpus = load_parallel(split, "en", "de")
    with open(f"{sys.argv[1]}/{name}.tsv", "w", encoding="utf-8") as out:
        out.writelines(f"{s}\t{t}\n" for s, t in zip(corpus.src[:n], corpus.tgt[:n]))
EOF
    corpus_flags=(--train-tsv "$runs/train.tsv" --valid-tsv "$runs/valid.tsv")
    limit_flags=(--epochs 2)
    eval_flags+=(--limit "$SENTENCES")
  fi
  local pids=()
  while read -r name flags; do
    # shellcheck disable=SC2086  # the flags are words
    OMP_NUM_THREADS=3 aiayn train --src "$SRC" --tgt "$TGT" "${corpus_flags[@]}" --out "$runs/$name" \
      --device "$DEVICE" "${limit_flags[@]}" $flags >"$logs/$name.log" 2>&1 &
    pids+=($!)
  done < <(train_configs)
  for pid in "${pids[@]}"; do wait "$pid" || echo "a training run failed: see $logs" >&2; done
  # Chosen on val only: each run's and the bundled model's BLEU at beam 4 on the validation split.
  aiayn eval --model "$SRC-$TGT" --split val --beam 4 --json "${eval_flags[@]}" >"$runs/bundled.val.json" \
    2>>"$logs/eval.log" &
  while read -r name _; do
    if [[ -f $runs/$name/model.safetensors ]]; then
      aiayn eval --model "$runs/$name" --split val --beam 4 --json "${eval_flags[@]}" >"$runs/$name.val.json" \
        2>>"$logs/eval.log" &
    fi
  done < <(train_configs)
  wait
  "$PYTHON" - "$runs" "$OUT/train_results.json" <<'EOF'
import json, sys
from pathlib import Path
runs, results = Path(sys.argv[1]), {}
for score in sorted(runs.glob("*.val.json")):
    name = score.name.removesuffix(".val.json")
    entry = {"val": json.loads(score.read_text() or "null")}
    record = runs / name / "training.json"
    if record.is_file():
        r = json.loads(record.read_text())
        entry["training"] = {k: r.get(k) for k in ("steps", "wall_seconds", "best_val_bleu", "stopped_by")}
        entry["epochs"] = len(r.get("epochs", []))
    results[name] = entry
trained = {n: e for n, e in results.items() if n != "bundled" and e["val"]}
best = max(trained, key=lambda n: trained[n]["val"]["bleu_lowercase"], default=None)
results["best"] = best
Path(sys.argv[2]).write_text(json.dumps(results, indent=2))
print(json.dumps({n: e["val"] and round(e["val"]["bleu_lowercase"], 2) for n, e in results.items() if n != "best"}),
      "best:", best)
(runs / "best").write_text(best or "")
EOF
  tar -czf "$OUT/train_runs.tar.gz" -C "$runs" --exclude=checkpoints --exclude='*.safetensors' \
    --exclude=tokenizer.json --exclude='*.tsv' .
  tar -czf "$OUT/train_logs.tar.gz" -C "$OUT" train-logs && rm -rf "$logs"
  local best
  best=$(cat "$runs/best")
  if [[ -n $best ]]; then  # the best run's folder comes back, in pieces under the 16 MiB a file may have
    tar -cf - -C "$runs" --exclude=checkpoints "$best" | split -b 15M -d -a 1 - "$OUT/best_run.tar."
  fi
}

cuda() {
  install_all
  probe
  # tests/cuda: each CUDA engine against the CPU fp32 engine on test_2016_flickr, and the page on CUDA.
  AIAYN_CUDA_TESTS_DEVICE=$DEVICE AIAYN_CUDA_TESTS_SENTENCES=$SENTENCES \
    AIAYN_CUDA_TESTS_RESULTS=$OUT/cuda_tests.jsonl \
    "$PYTHON" -m pytest -m cuda tests/cuda -q -rA -p no:cacheprovider 2>&1 | tee "$OUT/cuda_tests.log" || true
  # The serving engine on CUDA through the CLI, timed by `aiayn eval` (seconds for the whole split, BLEU): fp32 and
  # fp16, greedy and beam 4 (the dry run: fp32, whose graphs run on the CPU provider at speed).
  local eval_flags=() variants=(fp32 fp16)
  [[ $DRY_RUN == 1 ]] && eval_flags=(--limit "$SENTENCES") && variants=(fp32)
  for model in en-de de-en; do
    for variant in "${variants[@]}"; do
      for beam in 1 4; do
        aiayn eval --model "$model" --split test_2016_flickr --engine onnx --device "$DEVICE" \
          --variant "$variant" --beam "$beam" --json "${eval_flags[@]}" 2>>"$OUT/cuda_eval.log" |
          "$PYTHON" -c 'import json, sys; print(json.dumps(json.load(sys.stdin)))' >>"$OUT/cuda_eval.jsonl"
      done
    done
  done
  cat "$OUT/cuda_eval.jsonl"
  # Ours against CTranslate2 on the same GPU: greedy b1/b32/b128, beam 4 b32/b128, fp32 and fp16, the bundled model
  # and the base size, each engine's GPU memory; engines in processes of their own, interleaved round by round.
  if [[ $DRY_RUN != 1 ]]; then
    timeout 300 "$PYTHON" -m aiayn.cli bench --device cuda --quick --json "$OUT/bench_cuda.json" \
      >"$OUT/bench_cuda.txt" 2>&1 || echo "bench: exit $?" >>"$OUT/bench_cuda.txt"
  else  # the same bench code, its framing on the CPU (fp32) at a tiny size: the test that proves it
    "$PYTHON" -m pytest -q -p no:cacheprovider tests/bench/test_base_size_bench.py -k gpu_rows >"$OUT/bench_cuda.txt" 2>&1
  fi
  cat "$OUT/bench_cuda.txt"
}

case ${1:-} in
  pack) pack "${2:-}" ;;
  train) train ;;
  receive) receive ;;
  cuda) cuda ;;
  *)
    echo "usage: [DRY_RUN=1] scripts/gpu_session.sh pack [CORPUS_DIR] | train | receive | cuda" >&2
    exit 2
    ;;
esac
