"""A whole training step captured once as a CUDA graph and replayed: no host work per step.

Where a step's kernels are short, the host sets the pace: xl at context 512, batch 4, compiled blocks on an H100
runs 75 ms of kernels in a 120 ms step, the rest is Python, compiled-code wrappers, autograd and launch calls
(``scripts/device/compiled_attention_profile.py``). A CUDA graph of the whole step (forward, backward, gradient
clipping, optimizer) replays all of its kernels with one launch; this is PyTorch's "whole-network capture"
(the CUDA semantics notes), packaged so that ``bench`` and ``train`` can switch it on.

``CapturedStep(step_fn, optimizer=opt)``: ``step_fn(*inputs)`` runs one full step on its input tensors and returns
a tensor or a tuple of tensors (the loss, the gradient norm). The first ``warmup`` calls run it eagerly on a side
stream (compiles kernels, creates the optimizer's launch tables and other lazy state); the next call records it
on static copies of its inputs, then every call copies its inputs into those and replays. What a step needs:

* fixed shapes, dtypes and devices of the inputs (checked), and no host synchronisation inside the step
  (``.item()``, data-dependent shapes); capture fails with a ``RuntimeError`` that says so;
* the optimizer reads its per-step values from device memory: ``FusedAdamW`` (its ``before_graph_replay`` runs
  before each replay: learning rate, bias corrections, seeds; its ``after_graph_replay`` once the replay is
  launched: the step counts and the next step's values, uploaded ahead while the GPU runs); a changed ``lr``
  applies;
* gradients set to None at the start of the step (the graph allocates them from its private pool);
* autocast without its weight-cast cache (``cache_enabled=False``): cached casts would outlive the capture;
* anything the host writes for the graph between replays allocated before the capture: memory allocated during
  it comes from the graph's pool, where the replayed step's earlier kernels may use the same bytes (why
  ``FusedAdamW`` keeps a table for its captured launches from its eager ones).

The outputs are the graph's static tensors, overwritten by the next call. Loading optimizer state or moving
parameters after the capture invalidates the graph (the optimizer refuses to replay after ``load_state_dict``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

_WARMUP_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


def _warmup_stream(device: torch.device) -> torch.cuda.Stream:
    """One warm-up stream per device for every ``CapturedStep``: libraries keep a workspace per stream for the life
    of the process (cuBLAS: tens of MiB), so a new stream per captured step would leave one behind each time."""
    if device not in _WARMUP_STREAMS:
        _WARMUP_STREAMS[device] = torch.cuda.Stream(device)
    return _WARMUP_STREAMS[device]


class CapturedStep:
    """See the module docstring. ``warmup``: eager calls before the capture (at least 1: kernels compile on
    their first call, which a capture cannot record)."""

    def __init__(self, step_fn: Callable[..., Tensor | tuple[Tensor, ...]], *, optimizer=None, warmup: int = 2):
        if not isinstance(warmup, int) or isinstance(warmup, bool) or warmup < 1:
            raise ValueError(f"CapturedStep: warmup must be an int >= 1 (eager steps before the capture), "
                             f"got {warmup!r}")
        if optimizer is not None and not hasattr(optimizer, "before_graph_replay"):
            raise ValueError(f"CapturedStep: {type(optimizer).__name__} keeps its step count and learning rate on "
                             "the host, so a graph would replay the captured values; use "
                             "cs336_systems.fused.adamw.FusedAdamW")
        self.step_fn, self.optimizer, self.warmup = step_fn, optimizer, warmup
        self.calls = 0
        self.graph: torch.cuda.CUDAGraph | None = None
        self.static_inputs: tuple[Tensor, ...] = ()
        self.outputs = None

    @property
    def captured(self) -> bool:
        return self.graph is not None

    def __call__(self, *inputs: Tensor):
        if not inputs or not all(isinstance(t, Tensor) and t.is_cuda for t in inputs):
            raise ValueError("CapturedStep: the step's inputs must be CUDA tensors (a CUDA graph runs on the GPU)")
        self.calls += 1
        if self.graph is None and self.calls <= self.warmup:
            return self._eager(inputs)
        if self.graph is None:
            self._capture(inputs)
        else:
            self._check(inputs)
            for static, t in zip(self.static_inputs, inputs, strict=True):
                static.copy_(t, non_blocking=True)
        if self.optimizer is not None:
            self.optimizer.before_graph_replay()
        self.graph.replay()
        if self.optimizer is not None and hasattr(self.optimizer, "after_graph_replay"):
            self.optimizer.after_graph_replay()  # host work under the replay, which the GPU is running
        return self.outputs

    def _eager(self, inputs: tuple[Tensor, ...]):
        """A warm-up step on the side stream the capture will use (PyTorch's advice: not the default stream; lazy
        initialisation such as cuBLAS workspaces then happens before the capture, for that stream)."""
        current = torch.cuda.current_stream(inputs[0].device)
        side = _warmup_stream(inputs[0].device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            out = self.step_fn(*inputs)
        current.wait_stream(side)
        return out

    def _capture(self, inputs: tuple[Tensor, ...]) -> None:
        self.static_inputs = tuple(t.detach().clone() for t in inputs)
        torch.cuda.synchronize(inputs[0].device)
        torch.cuda.empty_cache()  # the warm-up's cached blocks: the graph's pool takes their place
        graph = torch.cuda.CUDAGraph()
        try:
            # on the warm-up stream: one stream's library workspaces (cuBLAS: 32 MiB on Hopper) serve both
            with torch.cuda.graph(graph, stream=_warmup_stream(inputs[0].device)):
                outputs = self.step_fn(*self.static_inputs)
        except RuntimeError as err:
            raise RuntimeError(f"CapturedStep: the step could not be captured as a CUDA graph ({err}); a captured "
                               "step may not synchronise with the host (.item(), data-dependent shapes) or change "
                               "shapes; run it without a CUDA graph") from err
        self.graph, self.outputs = graph, outputs

    def _check(self, inputs: tuple[Tensor, ...]) -> None:
        if len(inputs) != len(self.static_inputs):
            raise ValueError(f"CapturedStep: the step was captured with {len(self.static_inputs)} inputs, "
                             f"got {len(inputs)}")
        for i, (static, t) in enumerate(zip(self.static_inputs, inputs, strict=True)):
            if t.shape != static.shape or t.dtype != static.dtype or t.device != static.device:
                raise ValueError(f"CapturedStep: input {i} is {tuple(t.shape)} {t.dtype} on {t.device}; the graph "
                                 f"was captured with {tuple(static.shape)} {static.dtype} on {static.device} "
                                 "(a CUDA graph replays fixed shapes)")
