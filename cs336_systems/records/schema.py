"""The record kinds: one typed definition per ``results/<problem>/`` folder, shared by the writer
(``write_records`` validates every row against its kind) and the report's reader (``read_records``
returns typed rows). Also the problem names and record keys the report needs, so that the report
depends on records alone, never on the benchmark modules that write them.

A kind lists its fields with their JSON types; ``required`` fields identify a configuration and are
in every row, the others are measurements (absent or null when a configuration ran out of memory or
was skipped). A row with a field its kind does not list, or without a required one, is a
``ValueError`` naming the field: a typo or a renamed key fails at the write, not in the report.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

# ---- problem names (the folders under results/) ----
BENCHMARKING_SCRIPT = "benchmarking_script"
NSYS_PROFILE = "nsys_profile"
MIXED_PRECISION_ACCUMULATION = "mixed_precision_accumulation"
BENCHMARKING_MIXED_PRECISION = "benchmarking_mixed_precision"
MEMORY_PROFILING = "memory_profiling"
GRADIENT_CHECKPOINTING = "gradient_checkpointing"
PYTORCH_ATTENTION = "pytorch_attention"
TORCH_COMPILE = "torch_compile"
MFU_TARGET = "mfu_target"
FLASH_BENCHMARKING = "flash_benchmarking"
FLASH_LEADERBOARD = "flash_leaderboard"
FLASH_FEATURES = "flash_features"  # grouped-query heads, sliding window, packed documents vs peers (issue 21)
COMM_PROBLEM = "distributed_communication_single_node"
DDP_PROBLEM = "ddp_bucketed_benchmarking"  # every ddp-bench variant's records
SHARD_PROBLEM = "optimizer_state_sharding_accounting"  # every shard-bench variant's records (FSDP's too)
TRAIN = "train"
TRAINING_STEP = "training_step"  # one full training step, ours vs a compiled plain-PyTorch peer (issue 19)
LEADERBOARD_2026 = "leaderboard_2026"  # the 2026 handout's 8B training step (cs336-systems leaderboard)
LEADERBOARD_2026_QUALITY = "leaderboard_2026_quality"  # its bf16 quality guard

# ---- keys the report reads ----
# shard-bench's absolute allocator counters; each has a ``*_net_gib`` twin: the counter minus
# ``start_alloc_gib`` (what was allocated when the variant started).
ABS_MEMORY_KEYS = ("init_alloc_gib", "init_peak_gib", "pre_step_alloc_gib", "pre_step_peak_gib",
                   "post_step_alloc_gib", "post_step_peak_gib")


def net_key(key: str) -> str:
    """``init_alloc_gib`` -> ``init_alloc_net_gib``."""
    return key.removesuffix("_gib") + "_net_gib"


# pytorch_attention's sweep grid (the handout's)
ATTENTION_HEAD_DIMS = (16, 32, 64, 128)
ATTENTION_SEQ_LENS = (256, 1024, 4096, 8192, 16384)

# ``experiment``: the options of an experiment since moved to experiments/ that a run used (only in the
# records of those runs; see docs/report/history.md).

# JSON types, as Python types after ``json.loads``
NUM = (int, float)
INT, STR, BOOL, LIST, DICT = (int,), (str,), (bool,), (list,), (dict,)
ANY = (object,)


@dataclass(frozen=True)
class Provenance:
    """Where and how a record was measured. ``output`` is the record file relative to the results
    directory; ``command`` names the results directory relatively; ``migrated`` says which fields
    ``scripts/migrate_records.py`` changed and why (``git_commit`` there: inferred from git history)."""

    device: str
    torch: str
    date: str
    command: str
    git_commit: str
    triton: str | None = None
    cuda: str | None = None
    cudnn: int | None = None
    python: str | None = None
    gpu_count: int | None = None
    output: str | None = None
    nccl_env: dict[str, str] | None = None
    migrated: dict[str, str] | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "provenance") -> Provenance:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"{where}: unknown provenance field {unknown[0]!r}; allowed: {sorted(names)}")
        missing = [f.name for f in dataclasses.fields(cls)
                   if f.default is dataclasses.MISSING and f.name not in d]
        if missing:
            raise ValueError(f"{where}: provenance field {missing[0]!r} is missing")
        return cls(**d)



@dataclass(frozen=True)
class RecordKind:
    """The fields of one problem's records: name -> accepted JSON types."""

    problem: str
    doc: str
    required: Mapping[str, tuple[type, ...]]
    optional: Mapping[str, tuple[type, ...]]

    def validate(self, row: Mapping[str, Any], where: str = "") -> None:
        """Raise ``ValueError`` naming the first unknown, missing or ill-typed field of ``row``
        (JSON-normalised, without ``provenance``)."""
        at = f"{where}: " if where else ""
        for name in row:
            if name == "provenance":
                continue
            if name not in self.required and name not in self.optional:
                raise ValueError(f"{at}{self.problem} record has unknown field {name!r}; "
                                 f"the kind {self.problem!r} allows {sorted({**self.required, **self.optional})}")
        for name in self.required:
            if name not in row:
                raise ValueError(f"{at}{self.problem} record is missing the required field {name!r}")
        for name, value in row.items():
            if name == "provenance" or value is None:
                continue
            types = self.required.get(name) or self.optional[name]
            if not isinstance(value, types) or (isinstance(value, bool) and bool not in types and object not in types):
                raise ValueError(f"{at}{self.problem} record field {name!r} is {type(value).__name__} "
                                 f"{value!r:.60}; expected {' or '.join(t.__name__ for t in types)}")


class Record(Mapping[str, Any]):
    """One validated row as read back: a read-only mapping of its fields (``row["step_ms"]``,
    ``row.get("pair_ratio")``, ``"x" in row`` for "was x recorded") plus ``problem`` and a typed
    ``prov`` (:class:`Provenance`); ``row["provenance"]`` is the provenance as a dict."""

    __slots__ = ("_data", "problem", "prov")

    def __init__(self, problem: str, data: Mapping[str, Any], provenance: Mapping[str, Any]):
        self.problem, self.prov = problem, Provenance.from_dict(provenance)
        self._data = {**data, "provenance": dict(provenance)}

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"Record({self.problem!r}, {self._data!r})"

    def __eq__(self, other: object) -> bool:
        return self is other

    __hash__ = object.__hash__


def _f(spec: str, types: tuple[type, ...]) -> dict[str, tuple[type, ...]]:
    return dict.fromkeys(spec.split(), types)


def _timing(prefix: str) -> dict[str, tuple[type, ...]]:
    return _f(" ".join(f"{prefix}_{s}_ms" for s in ("mean", "median", "min", "std", "event_mean")), NUM)


# cs336-systems bench (e2e.py): one training-step configuration
_STEP_CONFIG = {**_f("preset attention checkpoint mode precision optimizer study status", STR),
                **_f("context_length batch_size warmup steps", INT), "compile": BOOL, "device": STR}
# the step's settings
_STEP_MEASURED = {**_f("loss impl residual_dtype rope ffn cublas_workspace cublas_workspace_config", STR),
                  # --qkv separate / packed: in the records of session 31's runs only (since moved to
                  # experiments/packed_qkv_rope/); --gemm torch / tuned likewise, session 51's
                  # (experiments/tuned_gemm/)
                  "qkv": STR, "gemm": STR,
                  **_f("peer_compiled cuda_graph isolated peak_tflops_shared", BOOL),
                  **_timing("forward"), **_timing("backward"), **_timing("optimizer"), **_timing("step"),
                  **_f("mfu model_tflops peak_memory_gib memory_before_gib peak_tflops tokens_per_s", NUM),
                  # untimed steps after the warm-up steps: for how long, and how many ran (absent from older records)
                  "warmup_seconds": NUM,
                  # phases or step: where the steps were synchronised (absent from older records: phases)
                  "timing": STR,
                  **_f("model_flops_per_step n_params settle_steps", INT), "step_times_ms": LIST,
                  # bench --impl ours peer: the peer's step beside ours (peer_sdpa: the SDPA backend it ran first);
                  # attention_choice: what flash_auto ran at the model's shape (flash_triton or an SDPA backend)
                  **_f("compile_scope error peer_impl peer_sdpa attention_choice", STR),
                  **_f("peer_step_mean_ms peer_peak_memory_gib step_ratio_vs_peer memory_ratio_vs_peer", NUM)}

_PRECISION_ROWS = {  # cs336-systems precision: accumulation loops and the autocast dtype table
    **_f("autocast dtype gradients logits loss summand accumulator loop", STR),
    **dict.fromkeys(("fc1 output", "layernorm output", "relu output", "parameters (inside autocast)"), STR),
    **_f("input_scale max_finite reference_fp64 rel_error variance abs_error exact result summand_as_stored", NUM),
    "finite": BOOL, "device": STR,
}

_FLASH_CONFIG = {**_f("impl dtype status", STR), **_f("batch heads head_dim seq_len", INT),
                 **_f("causal compiled_apply", BOOL)}
_FLASH_MEASURED = {**_f("forward_ms backward_ms forward_backward_ms forward_tflops backward_tflops "
                        "forward_backward_tflops forward_kernel_ms forward_backward_kernel_ms", NUM),
                   "flex_compile": STR, "error": STR}

_DIST_CONFIG = {**_f("preset precision status", STR), **_f("context_length batch_size world_size", INT)}
_DIST_SETUP = {**_f("attention backend", STR), **_f("warmup steps", INT), "device": ANY}

_SHARD_MEM = [*ABS_MEMORY_KEYS, *map(net_key, ABS_MEMORY_KEYS), "forward_saved_gib", "grads_gib",
              "optimizer_state_gib", "params_gib", "saved_activations_gib", "leftover_gib", "retained_prev_gib",
              "start_alloc_gib", "pair_partner_retained_gib"]

KINDS: dict[str, RecordKind] = {}


def _kind(problem: str, doc: str, required: dict, optional: dict) -> None:
    KINDS[problem] = RecordKind(problem, doc, required, optional)


for _p in (BENCHMARKING_SCRIPT, TORCH_COMPILE, GRADIENT_CHECKPOINTING, MFU_TARGET):
    _kind(_p, "cs336-systems bench: one training-step configuration, timed per phase",
          _STEP_CONFIG, _STEP_MEASURED)
_kind(BENCHMARKING_MIXED_PRECISION, "cs336-systems precision (autocast dtypes) and bench --precision runs",
      {}, {"kind": STR, **_STEP_CONFIG, **_STEP_MEASURED, **_PRECISION_ROWS})
_kind(TRAINING_STEP, "bench --problem training_step rows (--impl ours or peer), and the "
      "checks beside them (check=fused_ce_memory, check=loss)", {},
      {**_STEP_CONFIG, **_STEP_MEASURED,
       **_f("check path", STR),
       **_f("tokens d_model vocab seed", INT),
       **_f("inputs_gib peak_gib peak_above_inputs_gib bf16_logits_gib fraction_of_bf16_logits ms tflops lr "
            "first_loss final_loss_last10 relative_difference", NUM),
       "losses": LIST, "within_1_percent": BOOL})
_kind(LEADERBOARD_2026, "cs336-systems leaderboard: one 8B training step (ours or the handout's naive one), its "
      "memory plan and, with --check-logits, the comparison with the handout's model",
      {**_f("impl preset status", STR), **_f("layers context_length batch_size", INT)},
      {**_f("d_model vocab_size plan_uncheckpointed_blocks compile_cache_files_at_start nproc", INT),
       **_f("attention error rounding parallel", STR), "bucket_size_mb": NUM,
       **_f("warmup_ms rep_ms step_ms tokens_per_s model_tflop achieved_tflops matmul_peak_tflops mfu "
            "peak_memory_gib device_memory_gib wall_s forward_ms loss_ms backward_ms optimizer_ms "
            "logits_rel_error loss_ours loss_reference", NUM),
       **_f("plan_parameters_gib plan_gradients_gib plan_optimizer_state_gib plan_checkpointed_activations_gib "
            "plan_full_activations_gib plan_layer_recompute_peak_gib plan_loss_chunks_gib plan_workspace_gib "
            "plan_total_gib plan_block_saved_gib", NUM), "plan_block_saved_measured": BOOL})
_kind(LEADERBOARD_2026_QUALITY, "cs336-systems leaderboard --quality-check: bf16 everything vs fp32 masters",
      {**_f("preset", STR), **_f("steps context_length batch_size", INT)},
      {"seed": INT, "stochastic_rounding": BOOL,
       **_f("lr final_loss_bf16 final_loss_fp32_master relative_difference", NUM)})
_kind(MIXED_PRECISION_ACCUMULATION, "cs336-systems precision: one accumulation loop",
      _f("kind loop accumulator summand", STR), _f("abs_error exact result summand_as_stored", NUM))
_kind(NSYS_PROFILE, "cs336-systems profile: kernel table of one configuration",
      {**_f("preset attention precision scope status", STR), **_f("context_length batch_size warmup steps", INT)},
      {"device": ANY, **_f("attention_flops_per_step attention_ms_per_step phase_device_ms unprofiled", DICT),
       **_f("gemm_share kernel_ms_per_step top_kernel_calls_per_step", NUM), "kernels": LIST,
       **_f("n_kernel_names top_k", INT), "on_gpu": BOOL, **_f("top_kernel trace trace_dir error", STR)})
_kind(MEMORY_PROFILING, "cs336-systems memory: memory of one step, with its snapshot",
      {**_f("preset mode precision status", STR), **_f("context_length batch_size", INT)},
      {"device": ANY, **_f("warmup top_k", INT), "largest_allocations": LIST,
       **_f("snapshot snapshot_dir timeline_png error", STR),
       **_f("after_backward_gib after_forward_gib after_optimizer_gib baseline_gib block_saved_excluding_params_mib "
            "block_saved_for_backward_mib params_and_optimizer_state_gib peak_in_backward_gib peak_in_forward_gib "
            "peak_in_optimizer_gib peak_memory_gib residual_stream_mib_fp32 start_alloc_gib", NUM)})
_kind(PYTORCH_ATTENTION, "cs336-systems attention-bench: attention alone, or (kind=memory_accounting) its "
      "saved-bytes model",
      {**_f("backend status", STR), **_f("batch_size head_dim seq_len", INT), "compile": BOOL},
      {"device": ANY, **_f("dtype kind error", STR), "causal": BOOL, **_f("reps warmup", INT),
       **_timing("forward"), **_timing("backward"),
       **_f("memory_before_backward_gib peak_memory_gib bytes_per_score bytes_per_token device_memory_gib "
            "measured_before_backward_gib one_score_matrix_gib predicted_before_backward_gib qkv_and_output_gib "
            "saved_for_backward_gib saved_score_matrices", NUM)})
_kind(FLASH_BENCHMARKING, "cs336-systems flash-bench --only sweep: one implementation at one shape",
      _FLASH_CONFIG, _FLASH_MEASURED)
_kind(FLASH_LEADERBOARD, "cs336-systems flash-bench --only leaderboard: one implementation at a leaderboard shape",
      {**_FLASH_CONFIG, "config": STR},
      {**_FLASH_MEASURED, "matmul_peak_tflops": NUM, "suite": STR, "rounds": INT,  # rounds: --only shapes
       **_f("forward_ms_rounds forward_backward_ms_rounds forward_kernel_ms_rounds forward_backward_kernel_ms_rounds "
            "forward_sustained_ms_rounds forward_backward_sustained_ms_rounds", LIST),
       **_f("forward_sustained_ms forward_backward_sustained_ms", NUM)})  # --sustained-seconds
_kind(FLASH_FEATURES, "cs336-systems flash-bench --only features: one implementation at one of issue 21's shapes "
      "(grouped-query heads, a sliding window, packed documents), its role ours / peer / reference",
      {**_f("config impl role dtype status", STR), **_f("batch q_heads kv_heads seq_len head_dim", INT),
       "causal": BOOL},
      {**_f("window_left window_right n_docs doc_seed visible_pairs", INT), "doc_lengths": LIST,
       **_f("visible_fraction forward_ms forward_backward_ms forward_tflops forward_backward_tflops mask_build_ms "
            "max_abs_diff", NUM),
       **_f("mask diff_against flex_compile note error", STR)})
_kind(COMM_PROBLEM, "cs336-systems comm-bench: one all-reduce size on one world size",
      {**_f("backend device_type", STR), "size_mb": NUM, **_f("world_size warmup iters", INT)},
      {**_f("algbw_gbps busbw_gbps latency_mean_ms latency_median_ms latency_min_ms latency_std_ms", NUM),
       "bytes": INT, "per_rank_median_ms": LIST, "status": STR, "error": STR})
_kind(DDP_PROBLEM, "cs336-systems ddp-bench: one DDP variant's training step",
      {**_DIST_CONFIG, **_f("variant label", STR)},
      {**_DIST_SETUP, "bucket_size_mb": NUM, **_f("compile profile", BOOL), "timeout_s": NUM,
       **_f("comm_bytes_per_step comm_calls_per_step comm_hidden_ms comm_host_ms comm_kernel_ms comm_kernels "
            "compute_kernel_ms exposed_comm_ms extra_device_gib fwd_bwd_ms nocomm_fwd_bwd_ms nocomm_optimizer_ms "
            "nocomm_step_ms optimizer_ms overhead overhead_vs_slowest peak_memory_gib step_min_ms step_ms "
            "step_std_ms sync_ms tokens_per_s", NUM),
       **_f("grad_bytes n_params", INT),
       **_f("nocomm_slowest_times_ms nocomm_times_ms overhead_ci95 overhead_vs_slowest_ci95 step_times_ms", LIST),
       "timeline": DICT, **_f("timing peak_memory_scope grad_comm_dtype error", STR), "experiment": DICT})
_kind(SHARD_PROBLEM, "cs336-systems shard-bench: one sharding variant's training step and memory",
      {**_DIST_CONFIG, "variant": STR},
      {**_DIST_SETUP, **_f(" ".join(_SHARD_MEM), NUM), **_f(" ".join(k + "_per_rank" for k in _SHARD_MEM), LIST),
       **_f("allgather_kernel_ms comm_hidden_ms comm_kernel_ms compute_idle_ms compute_kernel_ms pair_ratio "
            "partner_step_ms ratio_to_none ratio_to_none_round_median step_min_ms step_ms step_std_ms", NUM),
       **_f("allgather_kernels comm_kernels local_param_numel memory_steps n_params rounds", INT),
       "local_param_numel_per_rank": LIST,
       **_f("losses_rank0 pair_partner_losses_rank0 pair_ratio_ci95 pair_ratios round_leftover_gib "
            "round_ratio_to_none round_retained_prev_gib round_step_ms", LIST),
       **_f("pair_with_none profile_cpu compile", BOOL), "optimizer": STR, "timeline": DICT,
       **_f("timing trace_file leftover_warning error", STR), "experiment": DICT})
_kind(TRAIN, "cs336-systems train: one logged step of a training run, with the run's configuration",
      {**_f("preset precision parallel attention", STR), **_f("step steps world_size", INT)},
      {**_f("context_length batch_size grad_accum warmup_steps seed log_every", INT),
       **_f("lr min_lr weight_decay grad_clip bucket_size_mb loss step_s tokens_per_s mfu peak_memory_gib", NUM),
       **_f("data device grad_comm_dtype residual_dtype rope ffn cublas_workspace", STR), "experiment": DICT,
       # the run's speed and model settings (TrainConfig; its loss setting as loss_fn: loss is the step's value)
       **_f("compile_scope optimizer loss_fn activation_checkpointing checkpoint_dir export metrics tensorboard", STR),
       **_f("compile cuda_graph resume", BOOL), **_f("num_kv_heads attention_window eos_id checkpoint_every", INT),
       "grad_norm": NUM})


def kind_of(problem: str) -> RecordKind:
    """The record kind of ``problem``; ``ValueError`` naming the known ones otherwise."""
    try:
        return KINDS[problem]
    except KeyError:
        raise ValueError(f"no record kind for problem {problem!r}; known: {sorted(KINDS)}") from None
