#!/usr/bin/env bash
# What a session with a lent GPU runs, in one call (device time is short): the machine and its
# versions, the ranks' checks of issue 20 (a world of one under torchrun against the plain run;
# two ranks on the one GPU refused), the GPU tier alone, then every tier (benchmarks/suite.py).
# Run from the checkout's root with the wheels in .whl/ (pydantic, platformdirs, ruff, mypy and
# their needs, and this package's own wheel), as docs/development.md says; writes its logs to
# benchmarks/results/gpu-run/ and, where $OUT is set (the device tool), packs them there.
# `bash benchmarks/device_run.sh memory`: issue 21's checks instead, in a call of their own
# (GPT-2 large under --memory-limit 16 and 24 against the eager grid of
# benchmarks/memory_regime.py, then the 1B decoder under 24 GiB: it tunes or exits 7 with its
# plan, then the GPU tier's memory tests). `memory-compiled`: the grid's compiled arms, which
# did not fit beside them in 15 minutes of device time: GPT-2 large under 16 GiB, tuned in
# speed mode against checkpointing off and on x eager and compiled (`--quick`: no memory-budget
# arms, no allocator axis), in a call of its own.
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

if [ "${1:-}" = memory-compiled ]; then
    # Sized for one call of 10 minutes: each compiled arm compiles GPT-2 large once (its batch
    # dimension dynamic), the tuner too; the progress file keeps what a cut leaves.
    step memory-regime-16-compiled 560 python3 benchmarks/memory_regime.py \
        --workloads gpt2-large --limits 16 --mode speed --quick --budget 240 --out "$out/mem16c"
    tail -20 "$out/memory-regime-16-compiled.log"
    if [ -n "${OUT:-}" ]; then tar czf "$OUT/gpu-run.tgz" -C "$(dirname "$out")" "$(basename "$out")"; fi
    exit 0
fi

if [ "${1:-}" = memory ]; then
    # Sized for 15 minutes of device time, start included: GPT-2 large under 16 GiB (where
    # checkpointing decides the batch) and 24 GiB, tuned in balanced mode against the eager
    # grid (checkpointing off and on, each its own largest batch; the tuner measures the
    # allocator in its own fresh process), each limit a step of its own so that a cut leaves
    # the other's table; then the 1B decoder under 24 GiB (it tunes or exits 7 with its plan);
    # then the GPU tier's tests, its memory tests first.
    for limit in 16 24; do
        step "memory-regime-$limit" 200 python3 benchmarks/memory_regime.py --workloads gpt2-large \
            --limits "$limit" --mode balanced --quick --eager-only --budget 90 --out "$out/mem$limit"
    done
    step llama-1b 110 autotune -m llama-1b --memory-limit 24 --mode balanced --budget 60 --no-save
    tests=""
    for name in a_memory_budget_lowers_the_compiled_steps_peak_on_the_gpu \
        where_the_optimizer_step_is_the_peak_foreach_is_measured_against_fused \
        a_memory_limit_holds_the_probe_to_a_smaller_gpu nvml_and_torch_agree_on_every_gpu \
        the_probe_measures_the_gpu_with_allocator_readings \
        the_probe_finds_the_real_limit_measures_compile_and_keeps_to_its_budget \
        the_bench_trains_every_arm_on_the_gpu_or_says_why_not; do
        tests="$tests tests/test_gpu.py::test_$name"
    done
    # shellcheck disable=SC2086  # one word a test
    step gpu-tier "$((575 - SECONDS))" python3 -m pytest -p no:randomly -p no:cacheprovider -v $tests
    for limit in 16 24; do tail -12 "$out/memory-regime-$limit.log"; done
    tail -30 "$out/llama-1b.log"; tail -15 "$out/gpu-tier.log"
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
