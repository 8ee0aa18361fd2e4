#!/usr/bin/env bash
# The GPU host's side of issues #5 and #6: every check that must run (not skip) there and
# every number the closing notes report, in one script, so a session's 30 device minutes go to
# running rather than typing. Build and pack first with tests/gpu/pack.sh.
#
# The device tool sends the working tree (not .device/ unless carried) and keeps /tmp between
# calls while the machine is warm, so files over the carry limit go over in several calls:
#   run(carry=[".device/bins.tar.xz", ".device/model.part.00"],
#       "bash tests/gpu/host.sh stash && bash tests/gpu/host.sh ops")
#   run(carry=[".device/model.part.01"], "bash tests/gpu/host.sh stash && ...")
#   run(carry=[".device/model.part.02"], "bash tests/gpu/host.sh stash && bash tests/gpu/host.sh engine && ...")
# (pack.sh made bins.tar.xz 12 MB and the model parts 36 + 36 + 26 MB; with the 14 MB working
# tree each call stays under the 64 MiB that travels. Back-to-back calls keep the machine, and
# /tmp, warm.)
# Each stage writes its logs under $OUT (at most 8 files come back: one per stage, plus a
# summary).
#
#   stash    copies the carried .device/ files to /tmp/ferrite-stash (kept while warm)
#   checks   ops, then engine:
#   ops      op tests (FERRITE_REQUIRE_CUDA=1: no silent skip); needs no model
#   engine   the engine's GPU-vs-CPU and GPU-vs-PyTorch tests
#   bench    bench latency (fp16, W8, W4 g128, W8A8 int8 and FP8; Llama-3-8B shape), bench kernels --mode model,
#            bench forward, and bench decode with and without scored prompts (in bench_forward.md)
#   ab       session 16's kernel choices against what they replaced, pair by pair in one run
#            (FERRITE_GEMV_ROWS=16|0|8, FERRITE_W8A8_GEMM=library|mma), and the down projection's
#            GEMV computing the gated activation against the activation kernel (FERRITE_FUSE_ACT=all|0)
#   startup  bench startup on a random-weight Qwen1.5-4B-shaped safetensors checkpoint
#   soak     bench soak against serve on the GPU, 0.7 minutes
#   profile  Nsight Compute per kernel of eager decode steps (fp16, W8A8), summed by
#            profile_table.py
#   tp       tensor parallelism on the one GPU (#23): doctor's NCCL all-reduce (eager and in a
#            graph), the sharded runner's tests (3 ranks sharing the GPU over the host against
#            1 rank; NCCL at world size 1 in the decode graphs; an NCCL init missing a rank),
#            NCCL's cost in a decode step of the 8B shape, bench collective (nccl, host),
#            and serve --tp 3 on the GPU over the OpenAI API, with a rank killed mid-stream
set -uo pipefail
cd "$(dirname "$0")/../.."
stage="${1:?stash | checks | ops | engine | bench | ab | startup | tp | soak | profile}"
OUT="${OUT:-/tmp/ferrite-out}"
mkdir -p "$OUT"
stash=/tmp/ferrite-stash
bin=/tmp/ferrite-bin
export LD_LIBRARY_PATH=/usr/local/cuda-13.0/targets/x86_64-linux/lib:/usr/lib/x86_64-linux-gnu
export FERRITE_REQUIRE_CUDA=1
export FERRITE_KERNEL_CACHE=/tmp/ferrite-kernels

# The test binaries find their fixtures by the absolute path they were built in.
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }

unpack_bins() {
  if [ ! -x "$bin/ferrite" ]; then
    mkdir -p "$bin" && tar -xJf "$stash/bins.tar.xz" -C "$bin" || exit 2
  fi
}

unpack() {
  unpack_bins
  local model="$HOME/.cache/ferrite/models/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf"
  if [ ! -s "$model" ]; then
    mkdir -p "$(dirname "$model")" && cat "$stash"/model.part.* >"$model" || exit 2
  fi
  export FERRITE_TEST_GGUF="$model"
}

case "$stage" in
stash)
  mkdir -p "$stash" && cp -v .device/* "$stash"/ 2>/dev/null
  ls -la "$stash"
  ;;
checks)
  bash "$0" ops && bash "$0" engine
  ;;
ops)
  unpack_bins
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/ops.txt"
  for t in nvrtc ops ops_linear attention sampling wq_ops wq_mma wq_mins gated_gemv w8a8_ops fp8_ops; do
    echo "== $t" | tee -a "$OUT/ops.txt"
    "$bin/$t" --test-threads=1 2>&1 | tail -40 | tee -a "$OUT/ops.txt"
  done
  ;;
engine)
  unpack
  python3 tests/fixtures/gpu/torch_reference.py /tmp/torch-ref >"$OUT/torch_reference.txt" 2>&1
  echo "== cuda_engine" | tee -a "$OUT/engine.txt"
  FERRITE_TORCH_REFERENCE=/tmp/torch-ref "$bin/cuda_engine" --test-threads=1 --nocapture 2>&1 |
    tail -60 | tee -a "$OUT/engine.txt"
  echo "== cuda_draws" | tee -a "$OUT/engine.txt"
  "$bin/cuda_draws" --test-threads=1 --nocapture 2>&1 | tail -20 | tee -a "$OUT/engine.txt"
  ;;
bench)
  unpack
  f="$bin/ferrite"
  common=(--device cuda --load-format dummy --model llama-3-8b --runs 3)
  # Each run capped, so one that stalls leaves the others their time (and the call its limit).
  {
    "$f" kernels build
    timeout 120 "$f" bench latency "${common[@]}" --configs interactive,high_concurrency
    timeout 60 "$f" bench latency "${common[@]}" --configs interactive --quantize rtn-w8pc-sym
    timeout 60 "$f" bench latency "${common[@]}" --configs interactive --quantize rtn-w4g128
    # Seed 003's W8A8 rows (int8 and FP8 kernels): its best row per configuration is the goal.
    timeout 120 "$f" bench latency "${common[@]}" --configs interactive,high_concurrency --quantize rtn-w8a8
    timeout 120 "$f" bench latency "${common[@]}" --configs interactive,high_concurrency --quantize rtn-fp8
  } >"$OUT/bench_latency.md" 2>&1
  timeout 150 "$f" bench kernels --mode model --prefill-tokens 2048 >"$OUT/bench_kernels.md" 2>&1
  timeout 60 "$f" bench forward --device cuda >"$OUT/bench_forward.md" 2>&1
  # Scored prompts (lm-eval's loglikelihoods) against plain prefill: on a GPU their chunks
  # are cut to max_num_seqs rows a step (the runner's room for logits).
  scoring=(--device cuda --load-format dummy --model llama-3-8b --batch-sizes 1,8
    --prompt-tokens 1000 --new-tokens 2 --runs 3 --max-model-len 1100)
  {
    timeout 60 "$f" bench decode "${scoring[@]}"
    timeout 90 "$f" bench decode "${scoring[@]}" --prompt-logprobs 1
  } >>"$OUT/bench_forward.md" 2>&1
  ;;
ab)
  # Session 16's kernel choices against what they replaced, each pair in one run: the dense
  # GEMV against cuBLAS (fp16 interactive), the GEMVs' second tile against the mma GEMM at
  # 9-16 rows (bench kernels' batch-16 column), cuBLASLt's int8 and FP8 GEMMs against the
  # hand-written tiles (W8A8 and FP8 high_concurrency); the down projection's GEMV computing
  # the gated activation from the gate|up buffer against the activation kernel then the plain
  # GEMV (fp16 and 4-bit interactive, where every decode step takes the GEMV).
  unpack
  f="$bin/ferrite"
  common=(--device cuda --load-format dummy --model llama-3-8b --runs 3)
  "$f" kernels build >/dev/null 2>&1
  {
    # Async scheduling (session 18) against steps one at a time: the default model's decode,
    # where a step is short and the host's share of it largest, and fp16 high concurrency;
    # then session 20's chained launch (step n+1 queued before step n's ids are back) off.
    for sched in on off chain0; do
      echo "== async scheduling: $sched (default model decode; fp16 high_concurrency)"
      env_=(FERRITE_ASYNC_SCHEDULING="${sched/chain0/on}")
      [ "$sched" = chain0 ] && env_+=(FERRITE_CHAIN_STEPS=0)
      env "${env_[@]}" timeout 60 "$f" bench decode --device cuda \
        --model smollm2-135m --batch-sizes 1,64 --prompt-tokens 128 --new-tokens 128 --runs 3
      [ "$sched" = chain0 ] && continue  # the decode alone: the host's share is largest there
      env "${env_[@]}" timeout 60 "$f" bench latency "${common[@]}" \
        --configs high_concurrency
    done
    # Session 21's draws with penalties and logprobs on the device (chained) against their
    # rows sampled on the host (not chained), every request with both.
    for extras in on 0; do
      echo "== FERRITE_DRAW_EXTRAS=$extras (default model decode, frequency penalty, 5 logprobs)"
      FERRITE_DRAW_EXTRAS=$extras timeout 60 "$f" bench decode --device cuda \
        --model smollm2-135m --batch-sizes 1,64 --prompt-tokens 128 --new-tokens 128 --runs 3 \
        --frequency-penalty 0.5 --logprobs 5
    done
    for rows in 16 0; do
      echo "== FERRITE_GEMV_ROWS=$rows (fp16 interactive)"
      FERRITE_GEMV_ROWS=$rows timeout 60 "$f" bench latency "${common[@]}" --configs interactive
    done
    for q in rtn-w8a8 rtn-fp8; do
      for gemm in library mma; do
        echo "== FERRITE_W8A8_GEMM=$gemm ($q high_concurrency)"
        FERRITE_W8A8_GEMM=$gemm timeout 90 "$f" bench latency "${common[@]}" \
          --configs high_concurrency --quantize "$q"
      done
    done
    for q in fp16 rtn-w4g128; do
      quant=()
      [ "$q" = fp16 ] || quant=(--quantize "$q")
      for fuse in all 0; do
        echo "== FERRITE_FUSE_ACT=$fuse ($q interactive)"
        FERRITE_FUSE_ACT=$fuse timeout 60 "$f" bench latency "${common[@]}" --configs interactive \
          "${quant[@]}"
      done
    done
    for rows in 16 8; do
      echo "== FERRITE_GEMV_ROWS=$rows (bench kernels)"
      FERRITE_GEMV_ROWS=$rows timeout 120 "$f" bench kernels --mode model --prefill-tokens 2048
    done
  } >"$OUT/ab.md" 2>&1
  ;;
startup)
  unpack
  python3 tests/fixtures/gpu/random_checkpoint.py qwen1.5-4b /tmp/qwen4b >"$OUT/startup.md" 2>&1
  # Warm page cache, as the goal states: read the checkpoint once before the measured starts.
  cat /tmp/qwen4b/*.safetensors >/dev/null
  "$bin/ferrite" bench startup --device cuda --models /tmp/qwen4b --max-model-len 2048 \
    --runs 3 >>"$OUT/startup.md" 2>&1
  ;;
tp)
  unpack
  f="$bin/ferrite"
  "$f" kernels build >/dev/null 2>&1
  {
    timeout 120 "$f" doctor --tp 1
    echo "== cuda_tensor_parallel"
    timeout 300 "$bin/cuda_tensor_parallel" --test-threads=1 --nocapture 2>&1 | tail -30
  } >"$OUT/tp.txt" 2>&1
  common=(--device cuda --load-format dummy --model llama-3-8b --runs 3 --configs interactive)
  {
    timeout 150 "$f" bench latency "${common[@]}"
    timeout 150 "$f" bench latency "${common[@]}" --collective nccl
  } >"$OUT/tp_nccl_cost.md" 2>&1
  # The 8B shape sharded over 2 ranks sharing the one GPU (host collective: NCCL refuses it).
  timeout 240 "$f" bench latency "${common[@]}" --tp 2 --collective host >"$OUT/tp_latency.md" 2>&1
  {
    timeout 60 "$f" bench collective --backend nccl --tp 1 --sizes 4K,64K,1M,16M,64M
    timeout 90 "$f" bench collective --backend host --tp 3 --sizes 4K,64K,1M,16M --iters 10
    # NCCL refuses two ranks on one GPU: the bench says so first.
    timeout 30 "$f" bench collective --backend nccl --tp 2 --sizes 4K
  } >"$OUT/tp_collective.md" 2>&1
  bash tests/gpu/serve_tp.sh "$f" >"$OUT/tp_serve.txt" 2>&1
  ;;
soak)
  # A minute of the soak's mixed clients against serve on the GPU (default model).
  unpack
  # A small share of the GPU's memory keeps the soak's cache small (it still does not preempt
  # there: this soak looks for leaks, cancellations and deadlines).
  timeout 90 "$bin/ferrite" bench soak --device cuda --model "$FERRITE_TEST_GGUF" \
    --minutes 0.7 --concurrency 64 --gpu-memory-utilization 0.05 >"$OUT/soak.md" 2>&1
  ;;
profile)
  # One eager decode step after another under Nsight Compute, per kernel (GPU.md's command):
  # fp16 and W8A8 int8 of the 8B shape; launch-skip passes start-up and prefill.
  unpack_bins
  "$bin/ferrite" kernels build >/dev/null 2>&1 # no NVRTC compiles inside the profiled run
  ncu=/usr/local/cuda-13.0/bin/ncu
  for q in none rtn-w8a8; do
    quant=()
    [ "$q" = none ] || quant=(--quantize "$q")
    timeout 150 "$ncu" --clock-control none --csv \
      --metrics gpu__time_duration.sum,dram__bytes_read.sum --launch-skip 6000 --launch-count 720 \
      "$bin/ferrite" bench latency --device cuda --load-format dummy --model llama-3-8b --runs 1 \
      --configs interactive --enforce-eager "${quant[@]}" >"/tmp/profile_$q.csv" 2>&1
  done
  python3 tests/gpu/profile_table.py /tmp/profile_none.csv /tmp/profile_rtn-w8a8.csv \
    >"$OUT/profile.md" 2>&1
  ;;
*)
  echo "unknown stage $stage" >&2
  exit 2
  ;;
esac
