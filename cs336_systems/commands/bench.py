"""``cs336-systems bench``: end-to-end benchmark sweep.

Sweeps presets x context lengths x modes x precisions x compile x attention backends x
checkpointing x optimizers and writes one record per configuration under
``results/<problem>/`` (``--problem``: which handout question the sweep answers). An
out-of-memory configuration is recorded as ``OOM`` and the sweep goes on.

``--default`` is the main job of ``make bench``: on a CUDA machine the handout's end-to-end
benchmark (presets small..2.7B, context 512, train step, fp32 and bf16); on a CPU-only machine the
``tiny`` preset for a few steps, which finishes in seconds.

Unless told otherwise, ``bench`` uses the fastest measured settings for the device
(:func:`cs336_systems.fast.fast_settings`: attention backend, compile scope, fused optimizer, fused loss, CUDA
graph, the residual stream's dtype)
and prints them; with no ``--preset`` it runs ``small`` at context 512 on CUDA and ``tiny`` at 128 on a CPU.
``--impl ours peer`` also times the compiled plain-PyTorch peer (``bench/peer.py``) in the same process and
writes our step / peer step and peak memory ratios into our records.

``--warmup-study`` runs every configuration with 0, 1, 2 and 5 warm-up steps, each in a fresh
interpreter so that nothing is warm from the configuration before it.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools

import pandas as pd
from tqdm import tqdm

import cs336_systems.attention
import cs336_systems.profiling.nvtx  # noqa: F401  (registers the "reference_nvtx" attention backend)
from cs336_systems.bench.e2e import (
    IMPLS,
    LOSSES,
    MODES,
    OPTIMIZERS,
    PRECISIONS,
    TIMINGS,
    BenchConfig,
    compute_dtype,
    run_benchmark,
    run_benchmark_isolated,
)
from cs336_systems.bench.harness import markdown_table
from cs336_systems.bench.recording import RecordWriter
from cs336_systems.configs import HANDOUT_PRESETS, get_preset
from cs336_systems.devices import resolve_device
from cs336_systems.fast import (
    CUBLAS_WORKSPACES,
    FFN_KERNELS,
    RESIDUAL_DTYPES,
    ROPE_KERNELS,
    apply_cublas_workspace,
    fast_settings,
)
from cs336_systems.profiling.timing import matmul_peak_tflops

PROBLEMS = ("benchmarking_script", "benchmarking_mixed_precision", "torch_compile", "gradient_checkpointing",
            "mfu_target", "training_step")
WARMUP_STUDY = (0, 1, 2, 5)
# untimed steps (seconds) after the warm-up steps on CUDA: a power-capped GPU settles in about one
# (docs/training_step.md, session 28)
WARMUP_SECONDS = 2.0
TABLE_COLUMNS = ["impl", "preset", "context_length", "mode", "precision", "compile", "attention", "checkpoint",
                 "optimizer", "loss", "cuda_graph", "residual_dtype", "rope", "ffn", "warmup", "status",
                 "forward_mean_ms", "backward_mean_ms", "optimizer_mean_ms", "step_mean_ms", "step_std_ms",
                 "tokens_per_s", "mfu", "peak_memory_gib", "step_ratio_vs_peer", "memory_ratio_vs_peer"]
CPU_DEFAULT = ("tiny", 128)  # preset and context without --preset on a CPU: seconds, not minutes
CUDA_DEFAULT = ("small", 512)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--default", action="store_true",
                   help="the main job: handout presets on CUDA, the tiny preset on CPU (overrides the sweep flags)")
    p.add_argument("--preset", nargs="+", default=None,
                   help="one or more presets, or 'all' (handout sizes); default small on CUDA, tiny on a CPU")
    p.add_argument("--context-length", nargs="+", type=int, default=None,
                   help="default: 512 on CUDA, 128 on a CPU")
    p.add_argument("--batch-size", type=int, default=None, help="default: the preset's (4)")
    p.add_argument("--mode", nargs="+", choices=MODES, default=["train-step"])
    p.add_argument("--precision", nargs="+", choices=PRECISIONS, default=["fp32"])
    p.add_argument("--compile", nargs="?", const="yes", default=None, choices=["no", "yes", "both"],
                   help="torch.compile the model: no, yes (bare --compile), or both (eager and compiled); "
                        "default: the fast settings'")
    p.add_argument("--compile-scope", choices=["model", "blocks"], default=None,
                   help="compile the whole model, or each Transformer block (regional: much faster to compile)")
    p.add_argument("--attention", nargs="+", default=None, help="attention backend name(s)")
    p.add_argument("--activation-checkpointing", "--checkpoint", dest="checkpoint", nargs="+", default=["none"],
                   help="activation checkpointing: 'none', 'selective' (save matmul outputs, recompute the rest), "
                        "'nested', or k = checkpoint every k blocks")
    p.add_argument("--optimizer", nargs="+", choices=OPTIMIZERS, default=None)
    p.add_argument("--loss", nargs="+", choices=LOSSES, default=None,
                   help="unfused (LM head, then cross-entropy) or fused (chunked, no logits tensor)")
    p.add_argument("--cuda-graph", choices=["no", "yes", "both"], default=None,
                   help="capture our train step as one CUDA graph and replay it (needs CUDA and --optimizer fused): "
                        "no, yes or both; default: the fast settings' (yes on CUDA where it applies)")
    p.add_argument("--residual-dtype", nargs="+", choices=RESIDUAL_DTYPES, default=None,
                   help="the residual stream's dtype under --precision bf16: fp32 (autocast's) or bf16 (the fused "
                        "optimizer keeps the token embedding as a bf16 copy too); default: the fast settings' (bf16 "
                        "on CUDA where it applies: bf16, --optimizer fused, train-step)")
    p.add_argument("--rope", nargs="+", choices=ROPE_KERNELS, default=None,
                   help="RoPE's kernel in our model: torch (the model's code, compiled with it) or triton "
                        "(cs336_systems.fused.rope, CUDA); default: the fast settings' (triton on CUDA)")
    p.add_argument("--ffn", nargs="+", choices=FFN_KERNELS, default=None,
                   help="the SwiGLU feed-forward in our model: torch (the model's code, compiled with it) or fused "
                        "(cs336_systems.fused.swiglu: SwiGLU in the matmuls' epilogues; Hopper kernels, bf16); "
                        "default: the fast settings' per preset and context (fused on Hopper under bf16 for steps of "
                        ">= 8,192 tokens at d_model >= 1,600, else torch)")
    p.add_argument("--cublas-workspace", choices=CUBLAS_WORKSPACES, default=None,
                   help="cuBLAS's workspace: PyTorch's default, or none (no workspace memsets before GEMMs); a "
                        "CUBLAS_WORKSPACE_CONFIG already set is kept. Given, it applies to peers too; not given, ours "
                        "take the fast settings' (none on CUDA) and peers PyTorch's default, as a plain script runs")
    p.add_argument("--impl", nargs="+", choices=IMPLS, default=["ours"],
                   help="ours, and/or peer: the compiled plain-PyTorch script, timed in the same run; peer-graphs: "
                        "the same compiled with mode='reduce-overhead' (CUDA graphs); ratios are against the faster")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--warmup-seconds", type=float, default=None,
                   help="after the warm-up steps, more untimed steps until they have run this long, so that the "
                        "GPU's clock and power settle on the timed work (default: 2 on CUDA, 0 on a CPU; 0 with "
                        "--warmup-study)")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--timing", choices=TIMINGS, default=None,
                   help="phases: a device synchronize around each step's forward, backward and optimizer (the "
                        "handout's breakdown); step: around whole steps only, as a training loop runs them. Default: "
                        "step when a peer is timed (the ratio compares whole steps; our captured step has no phases), "
                        "else phases")
    p.add_argument("--warmup-study", action="store_true",
                   help=f"run each configuration with {', '.join(map(str, WARMUP_STUDY))} warm-up steps, each in a "
                        "fresh process (overrides --warmup)")
    p.add_argument("--isolate", action="store_true",
                   help="run each configuration in a fresh process (the default on CUDA when ours is compared with "
                        "a peer: the earlier configuration's workspaces and cached kernels would count for the later)")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    p.add_argument("--problem", default="benchmarking_script", choices=PROBLEMS,
                   help="the handout problem these records answer (their folder under results/)")
    p.add_argument("--results-dir", default="results", help="where records are written")
    p.add_argument("--no-save", action="store_true", help="print the table only")


def configs_from_args(args: argparse.Namespace, log=print) -> list[BenchConfig]:
    device = resolve_device(args.device)
    if args.default:
        if device.type == "cuda":
            grid = itertools.product(HANDOUT_PRESETS, [512], ["train-step"], PRECISIONS)
            return [BenchConfig(preset=p, context_length=c, mode=m, precision=pr, warmup=5, steps=10)
                    for p, c, m, pr in grid]
        return [BenchConfig(preset="tiny", context_length=128, mode=m, precision="fp32", warmup=2, steps=5,
                            device="cpu") for m in MODES]
    preset_default, context_default = CUDA_DEFAULT if device.type == "cuda" else CPU_DEFAULT
    if args.preset is None:
        log(f"bench: no --preset given: {preset_default} at context {args.context_length or [context_default]} "
            f"on {device.type}")
    presets = args.preset or [preset_default]
    presets = list(HANDOUT_PRESETS) if presets == ["all"] else presets
    contexts = args.context_length or [context_default]
    fast = fast_settings(device)
    chosen = {name: getattr(args, name, None)
              for name in ("attention", "compile", "compile_scope", "optimizer", "loss", "cuda_graph",
                           "residual_dtype", "rope", "ffn", "cublas_workspace")}
    picked = {k: getattr(fast, k) for k, v in chosen.items() if v is None}
    vocab_loss = {p: fast_settings(device, get_preset(p).vocab_size).loss for p in presets}
    if "loss" in picked:
        picked["loss"] = "/".join(f"{v} ({p})" for p, v in vocab_loss.items())
    # the feed-forward's pick depends on the step's size: per preset and context
    shape_ffn = {(p, c): fast_settings(device, d_model=get_preset(p).d_model,
                                       tokens=(args.batch_size or get_preset(p).batch_size) * c).ffn
                 for p in presets for c in contexts}
    if "ffn" in picked:  # what the configurations below run (fused under bf16 only)
        shown = {k: v if "bf16" in args.precision else "torch" for k, v in shape_ffn.items()}
        picked["ffn"] = ("/".join(f"{v} ({p}/{c})" for (p, c), v in shown.items()) if len(set(shown.values())) > 1
                         else next(iter(shown.values())))
    if picked and "ours" in getattr(args, "impl", ["ours"]):
        log(f"bench: fast settings for {device.type}: " + ", ".join(f"{k}={v}" for k, v in picked.items()))
    attention = chosen["attention"] or [fast.attention]
    compile_flag = chosen["compile"] or ("yes" if fast.compile else "no")
    compiles = {"no": [False], "yes": [True], "both": [False, True]}[compile_flag]
    compile_scope = chosen["compile_scope"] or fast.compile_scope
    optimizers = chosen["optimizer"] or [fast.optimizer]
    # an explicit --cuda-graph applies as given (BenchConfig refuses what it cannot time); the fast default
    # only where it applies: our train step with the fused optimizer
    graphs = {"no": [False], "yes": [True], "both": [False, True]}[chosen["cuda_graph"] or "no"]
    graph_default = chosen["cuda_graph"] is None and fast.cuda_graph
    # the same for the residual dtype: the fast default where it applies (bf16, fused, train-step), else fp32
    residuals = chosen["residual_dtype"] or [None]
    ropes = chosen["rope"] or [fast.rope]
    workspace = chosen["cublas_workspace"] or fast.cublas_workspace
    # a peer runs as a plain script does (PyTorch's default) unless the user asked for a workspace setting; the
    # setting is per process, so it holds where configurations run isolated (bench's default for ours vs peers)
    peer_workspace = chosen["cublas_workspace"] or "default"

    def residual(r: str | None, precision: str, optimizer: str, mode: str) -> str:
        applies = precision == "bf16" and optimizer == "fused" and mode == "train-step"
        return r or (fast.residual_dtype if applies else "fp32")
    warmups = list(WARMUP_STUDY) if args.warmup_study else [args.warmup]
    settle = getattr(args, "warmup_seconds", None)
    if settle is None:
        settle = WARMUP_SECONDS if device.type == "cuda" and not args.warmup_study else 0.0
    if settle > 0:
        log(f"bench: after the warm-up steps, {settle:g} s of untimed steps (the GPU's clock and power settle on the "
            "timed work; --warmup-seconds)")
    impls = getattr(args, "impl", None) or ["ours"]
    given_timing = getattr(args, "timing", None)
    timing = given_timing or ("step" if set(impls) - {"ours"} else "phases")
    if given_timing is None and timing == "step":
        log("bench: timing whole steps (a synchronize around each step, none between its phases), as the ratio "
            "against the peer compares; --timing phases for the breakdown")
    configs = []
    for impl in impls:
        if impl != "ours":  # one peer per size and precision: our settings do not apply to it
            grid = itertools.product(presets, contexts, args.mode, args.precision, warmups)
            configs += [BenchConfig(impl=impl, preset=p, context_length=c, batch_size=args.batch_size, mode=m,
                                    precision=pr, compile=device.type == "cuda", attention="sdpa",
                                    optimizer="torch-fused", warmup=w, warmup_seconds=settle, steps=args.steps,
                                    timing=timing, device=args.device, cublas_workspace=peer_workspace)
                        for p, c, m, pr, w in grid]
            continue
        grid = [(p, c, m, pr, co, a, ck, o, lo, w) for p, c, m, pr, co, a, ck, o, w in itertools.product(
            presets, contexts, args.mode, args.precision, compiles, attention, args.checkpoint, optimizers, warmups)
            for lo in (chosen["loss"] or [vocab_loss[p]])]
        configs += [BenchConfig(preset=p, context_length=c, batch_size=args.batch_size, mode=m, precision=pr,
                                compile=co, compile_scope=compile_scope, attention=a, checkpoint=ck, optimizer=o,
                                loss=lo, warmup=w, warmup_seconds=settle, steps=args.steps, timing=timing,
                                device=args.device,
                                cuda_graph=g or (graph_default and m == "train-step" and o == "fused" and w >= 2),
                                residual_dtype=residual(r, pr, o, m), rope=rp, ffn=f, cublas_workspace=workspace)
                    for p, c, m, pr, co, a, ck, o, lo, w in grid for g in graphs for r in residuals for rp in ropes
                    for f in (chosen["ffn"] or [shape_ffn[p, c] if pr == "bf16" else "torch"])]
    # the peer of a size runs just before our configurations of that size, so a ratio needs no later pass;
    # otherwise the sweep keeps its order
    first_seen: dict[tuple, int] = {}
    for i, c in enumerate(c for c in configs if c.impl == "ours"):
        first_seen.setdefault(_peer_key(c), i)
    return sorted(configs, key=lambda c: (first_seen.get(_peer_key(c), -1), c.impl == "ours"))


def _peer_key(cfg: BenchConfig | dict) -> tuple:
    get = cfg.get if isinstance(cfg, dict) else lambda k: getattr(cfg, k)
    return (get("preset"), get("context_length"), get("mode"), get("precision"), get("warmup"))


def add_peer_ratios(record: dict, peers: dict[tuple, dict]) -> None:
    """Our step time and peak memory over those of the fastest peer of the same size, precision and mode (same
    run)."""
    peer = peers.get(_peer_key(record))
    if record.get("impl") != "ours" or peer is None or record.get("status") != "ok":
        return
    record.update(peer_impl=peer["impl"], peer_sdpa=peer.get("peer_sdpa"), peer_step_mean_ms=peer["step_mean_ms"],
                  peer_peak_memory_gib=peer.get("peak_memory_gib"),
                  step_ratio_vs_peer=record["step_mean_ms"] / peer["step_mean_ms"])
    if record.get("peak_memory_gib") and peer.get("peak_memory_gib"):
        record["memory_ratio_vs_peer"] = record["peak_memory_gib"] / peer["peak_memory_gib"]


def format_table(records: list[dict]) -> str:
    df = pd.DataFrame(records)
    cols = [c for c in TABLE_COLUMNS if c in df.columns]
    # Drop columns that do not vary and carry defaults, so the table stays readable.
    for col in ("checkpoint", "optimizer", "compile", "loss", "impl", "attention", "compile_scope", "cuda_graph",
                "residual_dtype", "rope", "ffn"):
        if col in cols and df[col].nunique() <= 1:
            cols.remove(col)
    return markdown_table(records, cols, ".3g")


def run(args: argparse.Namespace) -> int:
    configs = configs_from_args(args)
    impls = {c.impl for c in configs}
    compared = "ours" in impls and len(impls) > 1
    isolate = args.isolate or args.warmup_study or (compared and configs[0].torch_device.type == "cuda")
    if isolate and not (args.isolate or args.warmup_study):
        print("bench: ours against a peer on CUDA: each configuration in a fresh process (peak memory and "
              "warm state its own)")
    # before this process's first matmul (the peak below): cuBLAS reads its workspace setting once; compared runs
    # spawn each configuration, which applies its own (so only a setting every configuration shares is set here)
    shared = {c.cublas_workspace for c in configs}
    if len(shared) == 1:
        apply_cublas_workspace(shared.pop())
    if configs[0].torch_device.type == "cuda":
        # one MFU denominator per precision for the whole run, measured before any configuration heats the GPU: each
        # process's own measurement after its steps differed by a few % within one run
        peaks = {pr: matmul_peak_tflops("cuda", compute_dtype(pr)) for pr in sorted({c.precision for c in configs})}
        print("bench: MFU against the matmul peak measured now: "
              + ", ".join(f"{pr} {tf:.0f} TFLOP/s" for pr, tf in peaks.items()))
        configs = [dataclasses.replace(c, peak_tflops=peaks[c.precision]) for c in configs]
    writer = RecordWriter(args.problem, args.results_dir, configs[0].torch_device, enabled=not args.no_save)
    records, peers, oom = [], {}, []
    for cfg in tqdm(configs, desc="bench", unit="config", delay=2):
        record = run_benchmark_isolated(cfg) if isolate else run_benchmark(cfg)
        record["study"] = "warmup" if args.warmup_study else "sweep"
        record["isolated"] = isolate
        key = _peer_key(record)
        if cfg.impl != "ours" and record.get("status") == "ok" and (
                key not in peers or record["step_mean_ms"] < peers[key]["step_mean_ms"]):
            peers[key] = record  # the fastest peer of its size
        add_peer_ratios(record, peers)
        if record.get("status") == "OOM":  # the table shows the status; say what ran out, or why it did not run
            oom.append(f"bench: {cfg.impl} {cfg.preset}/{cfg.context_length} {cfg.mode} {cfg.precision}: OOM "
                       f"({record.get('error', 'out of memory')})")
        records.append(record)
        writer.add(record)  # on disk as soon as measured
    print("\n".join([*oom, format_table(records)]))
    if writer.path:
        print(f"\nrecords: {writer.path}")
    return 0
