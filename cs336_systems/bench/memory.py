"""Where the memory of a step goes (handout problem ``memory_profiling``).

On a GPU, one measured step (after warm-up, so the optimizer state exists) runs under
``torch.cuda.memory._record_memory_history``; the snapshot is dumped as a pickle for
pytorch.org/memory_viz and also read here: the active-memory timeline is drawn offline (PNG), and
the largest allocations are listed with the source line of our code that made them. On a CPU, where
the CUDA allocator history does not exist, the allocation events of ``torch.profiler``
(``profile_memory=True``) give the timeline instead.
"""

from __future__ import annotations

import gc
import pickle
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from cs336_basics.model import BasicsTransformerLM
from cs336_basics.nn_utils import cross_entropy
from cs336_basics.optimizer import AdamW
from cs336_systems.bench.e2e import PRECISIONS, autocast_context, is_oom
from cs336_systems.configs import get_preset
from cs336_systems.profiling.quiet import quiet_profile
from cs336_systems.profiling.saved_tensors import saved_tensor_bytes

MODES = ("forward", "train-step")
_OUR_CODE = ("cs336_basics", "cs336_systems")


@dataclass(kw_only=True)
class MemoryConfig:
    preset: str = "2.7B"
    context_length: int = 512
    batch_size: int | None = None
    mode: str = "train-step"
    precision: str = "fp32"
    warmup: int = 1
    top_k: int = 8
    device: str | None = None
    snapshot_dir: str | None = None  # write the memory_viz pickle and the timeline PNG here

    def __post_init__(self):
        get_preset(self.preset)
        if self.mode not in MODES:
            raise ValueError(f"memory_profiling: unknown mode {self.mode!r}; choose from {', '.join(MODES)}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"memory_profiling: unknown precision {self.precision!r}")
        if self.warmup < 0 or self.context_length < 1:
            raise ValueError("memory_profiling: need warmup >= 0 and context_length >= 1")

    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.device or ("cuda" if torch.cuda.is_available() else "cpu"))

    @property
    def tag(self) -> str:
        return f"{self.preset}-ctx{self.context_length}-{self.mode}-{self.precision}"


def residual_stream_bytes(preset: str, context_length: int, batch_size: int | None = None,
                          bytes_per_element: int = 4) -> int:
    """One residual-stream activation tensor (B, T, d_model), by default in fp32 (4 bytes)."""
    cfg = get_preset(preset)
    return (batch_size or cfg.batch_size) * context_length * cfg.d_model * bytes_per_element


def _frame_of_our_code(frames: list[dict]) -> str:
    """The innermost frame in our packages (where the allocation was asked for), else the innermost."""
    for fr in frames:
        if any(p in fr.get("filename", "") for p in _OUR_CODE):
            short = fr["filename"].split("/")[-2:]
            return f"{'/'.join(short)}:{fr.get('line')} {fr.get('name')}"
    if frames:
        fr = frames[0]
        return f"{fr.get('filename', '?').split('/')[-1]}:{fr.get('line')} {fr.get('name')}"
    return "(no Python frame: allocated by the autograd engine's backward thread)"


def analyze_snapshot(snapshot: dict, top_k: int = 8) -> dict:
    """Timeline of live bytes (per allocator event) and the largest allocations of a CUDA snapshot."""
    trace = snapshot["device_traces"][0] if snapshot.get("device_traces") else []
    live, timeline, allocs = 0, [], []
    for ev in trace:
        if ev["action"] == "alloc":
            live += ev["size"]
            allocs.append(ev)
        elif ev["action"] == "free_completed":
            live -= ev["size"]
        else:
            continue
        timeline.append(live)
    allocs.sort(key=lambda e: e["size"], reverse=True)
    largest = [{"size_mib": e["size"] / 2**20, "where": _frame_of_our_code(e.get("frames", []))}
               for e in allocs[:top_k]]
    return {"timeline_bytes": timeline, "largest_allocations": largest}


def plot_timeline(timeline_bytes: list[int], baseline_bytes: int, title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.5))
    ax.plot([(baseline_bytes + b) / 2**30 for b in timeline_bytes], lw=1)
    ax.set_xlabel("allocator event (alloc / free) during the measured step")
    ax.set_ylabel("allocated memory (GiB)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_memory_profile(cfg: MemoryConfig) -> dict:
    device = cfg.torch_device
    on_gpu = device.type == "cuda"
    model_cfg = get_preset(cfg.preset)
    batch = cfg.batch_size or model_cfg.batch_size
    model_cfg = model_cfg.replace(context_length=cfg.context_length, batch_size=batch)
    record: dict = {**asdict(cfg), "batch_size": batch,
                    "residual_stream_mib_fp32": residual_stream_bytes(cfg.preset, cfg.context_length, batch) / 2**20}
    model = optimizer = None
    try:
        if on_gpu:
            gc.collect()
            torch.cuda.synchronize(device)
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
            # Nothing of ours should be resident between configurations; anything here would inflate
            # every number below (the report subtracts it and says so).
            record["start_alloc_gib"] = torch.cuda.memory_allocated(device) / 2**30
        model = BasicsTransformerLM(**model_cfg.model_kwargs(), check_inputs=False, device=device)
        optimizer = AdamW(model.parameters(), lr=1e-4) if cfg.mode == "train-step" else None
        x = torch.randint(0, model_cfg.vocab_size, (batch, cfg.context_length), device=device)
        y = torch.randint(0, model_cfg.vocab_size, (batch, cfg.context_length), device=device)
        marks: dict[str, float] = {}

        def allocated() -> float:
            return torch.cuda.memory_allocated(device) / 2**30 if on_gpu else float("nan")

        def phase_end(name: str) -> None:
            # memory allocated at the end of the phase, and the peak reached inside it
            marks[f"after_{name}_gib"] = allocated()
            if on_gpu:
                marks[f"peak_in_{name}_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
                torch.cuda.reset_peak_memory_stats(device)

        def one_step() -> None:
            if cfg.mode == "forward":
                with autocast_context(cfg.precision, device), torch.no_grad():
                    model(x)
                phase_end("forward")
                return
            with autocast_context(cfg.precision, device):
                loss = cross_entropy(model(x), y)
            phase_end("forward")
            loss.backward()
            phase_end("backward")
            optimizer.step()
            phase_end("optimizer")
            model.zero_grad(set_to_none=True)

        for _ in range(cfg.warmup):
            one_step()
        state_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        if optimizer is not None:
            state_bytes += sum(t.numel() * t.element_size() for st in optimizer.state.values()
                               for t in st.values() if torch.is_tensor(t))
        record["params_and_optimizer_state_gib"] = state_bytes / 2**30
        snapshot_path = png_path = None
        if cfg.snapshot_dir:
            Path(cfg.snapshot_dir).mkdir(parents=True, exist_ok=True)
            snapshot_path = Path(cfg.snapshot_dir) / f"memory-{cfg.tag}.pickle"
            png_path = Path(cfg.snapshot_dir) / f"memory-{cfg.tag}.png"
        if on_gpu:
            torch.cuda.synchronize(device)
            baseline = torch.cuda.memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
            torch.cuda.memory._record_memory_history(max_entries=1_000_000, stacks="python")
            try:
                one_step()
                torch.cuda.synchronize(device)
                snapshot = torch.cuda.memory._snapshot()
            finally:
                torch.cuda.memory._record_memory_history(enabled=None)
            record["peak_memory_gib"] = max(v for k, v in marks.items() if k.startswith("peak_in_"))
            analysis = analyze_snapshot(snapshot, cfg.top_k)
            if snapshot_path is not None:
                with snapshot_path.open("wb") as f:
                    pickle.dump(snapshot, f)
        else:
            baseline = state_bytes
            with quiet_profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
                one_step()
            # Each operator's self memory (allocated minus freed inside it, children excluded) plus the
            # frees that happen outside any operator ("[memory]" events), in start order.
            live, timeline = 0, []
            for ev in sorted(prof.events(), key=lambda e: e.time_range.start):
                delta = ev.cpu_memory_usage if ev.name == "[memory]" else ev.self_cpu_memory_usage
                if delta:
                    live += delta
                    timeline.append(live)
            analysis = {"timeline_bytes": timeline, "largest_allocations": []}
            record["peak_memory_gib"] = (baseline + max(0, *timeline)) / 2**30
        record.update(marks)
        record["baseline_gib"] = baseline / 2**30
        record["largest_allocations"] = analysis["largest_allocations"]
        if png_path is not None:
            plot_timeline(analysis["timeline_bytes"], baseline,
                          f"{cfg.preset}, context {cfg.context_length}, {cfg.mode}, {cfg.precision}", png_path)
            record["timeline_png"] = png_path.name
            record["snapshot"] = snapshot_path.name if on_gpu else None
        if cfg.mode == "train-step":
            # Saved-for-backward bytes of one Transformer block (the "residuals"), read with autograd hooks.
            block = model.layers[0]
            h = torch.randn(batch, cfg.context_length, model_cfg.d_model, device=device, requires_grad=True)
            pos = torch.arange(cfg.context_length, device=device)
            with autocast_context(cfg.precision, device):
                param_bytes = sum(p.numel() * p.element_size() for p in block.parameters())
                saved = saved_tensor_bytes(block, h, pos)
            record["block_saved_for_backward_mib"] = saved / 2**20
            record["block_saved_excluding_params_mib"] = max(saved - param_bytes, 0) / 2**20
    except (torch.OutOfMemoryError, RuntimeError) as err:
        if not is_oom(err):
            raise
        record.update(status="OOM", error=str(err).splitlines()[0][:200])
    else:
        record["status"] = "ok"
    finally:
        model = optimizer = None
        gc.collect()
        if on_gpu:
            torch.cuda.empty_cache()
    return record
