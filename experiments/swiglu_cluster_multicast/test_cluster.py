"""The cluster kernels' GPU test as it ran in session 32 (cdd7a91: 4 passed on an H100). Run from this folder:
``python -m pytest -q test_cluster.py`` (it imports ``swiglu_gemm_cluster.py`` beside it)."""

from __future__ import annotations

import pytest
import torch

HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


@pytest.mark.skipif(not HOPPER, reason="the Gluon kernels are sm_90's")
@pytest.mark.parametrize("m,k,n", [(777, 200, 328), (2048, 1600, 6400), (130, 64, 136), (64, 64, 3000)])
def test_gluon_kernels_in_clusters_of_two_give_the_same_bits(m, k, n):
    import swiglu_gemm_cluster as swiglu_gemm

    dev, bf16 = "cuda", torch.bfloat16
    x, dy = torch.randn(m, k, device=dev, dtype=bf16), torch.randn(m, k, device=dev, dtype=bf16)
    w1, w3 = (torch.randn(n, k, device=dev, dtype=bf16) / k**0.5 for _ in range(2))
    w2 = torch.randn(k, n, device=dev, dtype=bf16) / n**0.5
    for u, v in zip(swiglu_gemm.dual_swiglu(x, w1, w3, cluster=1), swiglu_gemm.dual_swiglu(x, w1, w3, cluster=2),
                    strict=True):
        assert torch.equal(u, v)
    a, b = x @ w1.T, x @ w3.T
    for u, v in zip(swiglu_gemm.swiglu_backward(dy, w2, a, b, cluster=1),
                    swiglu_gemm.swiglu_backward(dy, w2, a, b, cluster=2), strict=True):
        assert torch.equal(u, v)
