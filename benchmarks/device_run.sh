#!/usr/bin/env bash
# What a session with a lent GPU runs, in one call (device time is short): the machine and its
# versions, the ranks' checks of issue 20 (a world of one under torchrun against the plain run;
# two ranks on the one GPU refused), the GPU tier alone, then every tier (benchmarks/suite.py).
# Run from the checkout's root with the wheels in .whl/ (pydantic, platformdirs, ruff, mypy and
# their needs, and this package's own wheel), as docs/development.md says; writes its logs to
# benchmarks/results/gpu-run/ and, where $OUT is set (the device tool), packs them there.
# `bash benchmarks/device_run.sh memory`: issue 21's checks instead, in a call of their own
# (GPT-2 large under --memory-limit 24 against the quick grid of benchmarks/memory_regime.py,
# then the 1B decoder under 24 GiB: it tunes or exits 7 with its plan).
set -u
out=benchmarks/results/gpu-run
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PATH="/tmp/site/bin:$PATH" PYTHONUNBUFFERED=1
{
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    python3 -c 'import sys, torch, triton; print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version(), "triton", triton.__version__, "python", sys.version.split()[0])'
} > "$out/device.txt" 2>&1
cat "$out/device.txt"

step() {  # name, seconds, command...: its log in $out, its exit code and time in steps.txt
    local name="$1" limit="$2"
    shift 2
    local began=$SECONDS
    timeout "$limit" "$@" > "$out/$name.log" 2>&1
    local code=$?
    echo "$name: exit $code in $((SECONDS - began)) s" | tee -a "$out/steps.txt"
}

if [ "${1:-}" = memory ]; then
    # The grid first (its progress lines survive a cut), then the 1B decoder; the GPU tier
    # (its memory tests among them) runs with every tier, in the call without an argument.
    step memory-regime 430 python3 benchmarks/memory_regime.py --quick \
        --workloads gpt2-large --limits 24 --budget 150 --out "$out"
    step llama-1b "$((580 - SECONDS))" autotune -m llama-1b --memory-limit 24 --mode balanced \
        --budget 90 --no-save
    tail -40 "$out/memory-regime.log"; tail -30 "$out/llama-1b.log"
    if [ -n "${OUT:-}" ]; then tar czf "$OUT/gpu-run.tgz" -C "$(dirname "$out")" "$(basename "$out")"; fi
    exit 0
fi

# A world of one through torchrun gives the plain run's answer (balanced: no compile, short).
step plain 150 autotune -m gpt2 --mode balanced --budget 40 --no-save
step torchrun-1 150 torchrun --nproc-per-node=1 --rdzv-backend=c10d --rdzv-endpoint=localhost:0 \
    --max-restarts=0 -m torch_autotune -m gpt2 --mode balanced --budget 40 --no-save
# Two ranks on the one GPU: refused in one line, before any rank starts.
step two-ranks 60 autotune -m gpt2 --nproc-per-node 2 --no-save
grep -h -E "largest batch|recommended|ranks  " "$out/plain.log" "$out/torchrun-1.log"
cat "$out/two-ranks.log"

step suite "${SUITE_S:-$((545 - SECONDS))}" python3 benchmarks/suite.py --out "$out" -- -n 8 -p no:randomly
tail -25 "$out/suite.log"
if [ -n "${OUT:-}" ]; then tar czf "$OUT/gpu-run.tgz" -C "$(dirname "$out")" "$(basename "$out")"; fi
