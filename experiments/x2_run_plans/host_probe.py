"""Diagnostic: does the eager single-GPU step get slower once NCCL is initialised in the process?

Run under torchrun with 2 processes on a 2-GPU machine (experiments/x2_run_plans/x2.sh plan p). Each rank times
the plain xl training step (bf16 autocast, our AdamW, no wrapper, no collectives inside the step) in
phases: A before any NCCL communicator exists; B after one all-reduce created it (idle during the
steps); C after destroying the process group; then prints medians per phase and the process' thread
count. Rank-local timing (synchronize at both ends of a step); results printed, not recorded.
"""

from __future__ import annotations

import os
import statistics
import timeit

import torch
import torch.distributed as dist

from cs336_basics.model import BasicsTransformerLM
from cs336_basics.nn_utils import cross_entropy
from cs336_basics.optimizer import AdamW
from cs336_systems.configs import get_preset


def main(steps: int = 12) -> None:
    rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    dist.init_process_group("nccl")  # lazy: no communicator until the first collective
    cfg = get_preset("xl").replace(context_length=512)
    torch.manual_seed(0)
    model = BasicsTransformerLM(**cfg.model_kwargs(), check_inputs=False, device=dev)
    opt = AdamW(model.parameters(), lr=1e-5)
    x, y = (torch.randint(0, cfg.vocab_size, (4, 512), device=dev) for _ in range(2))

    def step() -> float:
        torch.cuda.synchronize(dev)
        t0 = timeit.default_timer()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize(dev)
        return (timeit.default_timer() - t0) * 1e3

    def phase(name: str) -> None:
        for _ in range(2):
            step()
        ms = [step() for _ in range(steps)]
        threads = len(os.listdir("/proc/self/task"))
        print(f"rank {rank} phase {name}: median {statistics.median(ms):.1f} ms, min {min(ms):.1f}, "
              f"max {max(ms):.1f}, threads {threads}, cpus {len(os.sched_getaffinity(0))}", flush=True)

    phase("A-no-nccl")
    t = torch.ones(1, device=dev)
    dist.all_reduce(t)
    torch.cuda.synchronize(dev)
    phase("B-nccl-idle")
    phase("B2-nccl-idle")
    dist.destroy_process_group()
    phase("C-destroyed")


if __name__ == "__main__":
    main()
