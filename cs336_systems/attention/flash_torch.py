# ruff: noqa: E741  (O, the attention output, is the handout's name)
"""FlashAttention-2 in plain PyTorch (no Triton): the tiled reference the Triton kernels are checked against.

Forward: Algorithm 1 of the handout (online softmax over key tiles). The loop over query tiles is a batch
dimension here, as it is the launch grid on a GPU: every query tile keeps its own running max ``m``,
denominator ``l`` and output accumulator, and sees one ``Bq x Bk`` score tile per step. With
``is_causal`` the query tiles entirely above the diagonal are skipped for each key tile. It returns O and
saves the logsumexp L (natural log, shape ``Q.shape[:-1]``), Q, K, V, O.

Backward: recomputation from L (handout equations 13-19): P = exp(S - L), D = rowsum(O * dO),
dS = P * (dP - D). It walks chunks of query rows (bounded memory), accumulating dK and dV; each chunk is
a ``torch.compile``-d function on CUDA and the same function run eagerly on the CPU.

Inputs: Q ``(..., Nq, d)``, K and V ``(..., Nk, d)``, any leading dims, any lengths >= 1, d in
[16, 256], fp16 / bf16 / fp32 (and fp64, handy as a reference). Arithmetic runs in fp32 (fp64 for fp64
inputs); O is returned in the input dtype, L in fp32. Causal masking is top-left aligned: query i sees
keys 0..i.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from cs336_basics.attention import register_attention_backend
from cs336_systems.attention._common import check_attention_inputs, check_grad_output, check_is_causal

Q_TILE, K_TILE = 64, 64  # >= 16 x 16 (handout); the query-tile loop is batched so these only bound memory
_BWD_CHUNK_ELEMENTS = 1 << 26  # score-matrix elements per backward chunk (256 MB in fp32)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def tiled_forward(Q: Tensor, K: Tensor, V: Tensor, is_causal: bool = False, q_tile: int = Q_TILE,
                  k_tile: int = K_TILE) -> tuple[Tensor, Tensor]:
    """(O, L) of softmax(Q K^T / sqrt(d)) V by online softmax over ``q_tile x k_tile`` score tiles."""
    if q_tile < 16 or k_tile < 16:
        raise ValueError(f"tiles must be at least 16 x 16, got {q_tile} x {k_tile}")
    lead, (n_q, d), n_k = Q.shape[:-2], Q.shape[-2:], K.shape[-2]
    cdtype = _compute_dtype(Q.dtype)
    q = Q.reshape(-1, n_q, d).to(cdtype)  # (B, Nq, d)
    k = K.reshape(-1, n_k, d).to(cdtype)  # (B, Nk, d)
    v = V.reshape(-1, n_k, d).to(cdtype)
    batch = q.shape[0]
    t_q, t_k = math.ceil(n_q / q_tile), math.ceil(n_k / k_tile)
    q = torch.nn.functional.pad(q, (0, 0, 0, t_q * q_tile - n_q)).view(batch, t_q, q_tile, d)
    k = torch.nn.functional.pad(k, (0, 0, 0, t_k * k_tile - n_k))
    v = torch.nn.functional.pad(v, (0, 0, 0, t_k * k_tile - n_k))
    scale = 1.0 / math.sqrt(d)

    acc = torch.zeros(batch, t_q, q_tile, d, dtype=cdtype, device=Q.device)  # O~ per query tile
    l_run = torch.zeros(batch, t_q, q_tile, dtype=cdtype, device=Q.device)
    m_run = torch.full((batch, t_q, q_tile), float("-inf"), dtype=cdtype, device=Q.device)
    q_idx = torch.arange(t_q * q_tile, device=Q.device).view(t_q, q_tile)
    for j in range(t_k):
        # Query tiles whose last row is before this key tile see none of it (causal): skip them.
        i0 = min((j * k_tile) // q_tile, t_q) if is_causal else 0
        if i0 >= t_q:
            break
        k_j, v_j = k[:, j * k_tile:(j + 1) * k_tile], v[:, j * k_tile:(j + 1) * k_tile]  # (B, Bk, d)
        k_idx = torch.arange(j * k_tile, (j + 1) * k_tile, device=Q.device)
        s = torch.einsum("btqd,bkd->btqk", q[:, i0:], k_j) * scale  # (B, Tq - i0, Bq, Bk)
        visible = (k_idx < n_k).expand(t_q - i0, q_tile, k_tile)
        if is_causal:
            visible = visible & (k_idx <= q_idx[i0:, :, None])
        s = s.masked_fill(~visible, float("-inf"))
        m_new = torch.maximum(m_run[:, i0:], s.amax(dim=-1))  # finite: key 0 is seen in tile j=0
        p = torch.exp(s - m_new[..., None])
        alpha = torch.exp(m_run[:, i0:] - m_new)
        l_run[:, i0:] = alpha * l_run[:, i0:] + p.sum(dim=-1)
        acc[:, i0:] = alpha[..., None] * acc[:, i0:] + torch.einsum("btqk,bkd->btqd", p, v_j)
        m_run[:, i0:] = m_new
    out = (acc / l_run[..., None]).view(batch, t_q * q_tile, d)[:, :n_q]
    lse = (m_run + torch.log(l_run)).view(batch, t_q * q_tile)[:, :n_q]
    l_dtype = torch.float64 if Q.dtype == torch.float64 else torch.float32
    return out.reshape(*lead, n_q, d).to(Q.dtype), lse.reshape(*lead, n_q).to(l_dtype)


def _backward_chunk(q: Tensor, k: Tensor, v: Tensor, o: Tensor, do: Tensor, lse: Tensor, q_idx: Tensor,
                    scale: float, is_causal: bool) -> tuple[Tensor, Tensor, Tensor]:
    """Equations 13-19 for a chunk of query rows. q, o, do: (B, c, d); k, v: (B, Nk, d); lse: (B, c)."""
    s = q @ k.transpose(-1, -2) * scale  # (13)  (B, c, Nk)
    p = torch.exp(s - lse[..., None])  # (14)
    if is_causal:
        k_idx = torch.arange(k.shape[-2], device=k.device)
        p = p.masked_fill(k_idx[None, :] > q_idx[:, None], 0.0)
    delta = (o * do).sum(-1)  # D = rowsum(O * dO)
    dv = p.transpose(-1, -2) @ do  # (15)
    dp = do @ v.transpose(-1, -2)  # (16)
    ds = p * (dp - delta[..., None])  # (17)
    dq = ds @ k * scale  # (18)
    dk = ds.transpose(-1, -2) @ q * scale  # (19)
    return dq, dk, dv


_compiled_chunk = None


def _chunk_fn(device: torch.device):
    """torch.compile-d chunk on CUDA; eager on the CPU (no C++ toolchain is assumed there)."""
    global _compiled_chunk
    if device.type != "cuda":
        return _backward_chunk
    if _compiled_chunk is None:
        _compiled_chunk = torch.compile(_backward_chunk)  # dynamic after the first new shape
    return _compiled_chunk


def recompute_backward(Q: Tensor, K: Tensor, V: Tensor, O: Tensor, dO: Tensor, L: Tensor,
                       is_causal: bool) -> tuple[Tensor, Tensor, Tensor]:
    """(dQ, dK, dV) by recomputing P from the logsumexp L (equations 13-19), in chunks of query rows."""
    check_grad_output(dO, O)
    lead, (n_q, d), n_k = Q.shape[:-2], Q.shape[-2:], K.shape[-2]
    cdtype = _compute_dtype(Q.dtype)
    q, o, do = (t.reshape(-1, n_q, d).to(cdtype) for t in (Q, O, dO))
    k, v = (t.reshape(-1, n_k, d).to(cdtype) for t in (K, V))
    lse = L.reshape(-1, n_q).to(cdtype)
    batch = q.shape[0]
    chunk = max(16, min(n_q, _BWD_CHUNK_ELEMENTS // max(1, batch * n_k)))
    fn = _chunk_fn(Q.device)
    dq = torch.empty_like(q)
    dk, dv = torch.zeros_like(k), torch.zeros_like(v)
    q_idx = torch.arange(n_q, device=Q.device)
    for c0 in range(0, n_q, chunk):
        c1 = min(n_q, c0 + chunk)
        dq_c, dk_c, dv_c = fn(q[:, c0:c1], k, v, o[:, c0:c1], do[:, c0:c1], lse[:, c0:c1], q_idx[c0:c1],
                              1.0 / math.sqrt(d), is_causal)
        dq[:, c0:c1] = dq_c
        dk += dk_c
        dv += dv_c
    return (dq.reshape(*lead, n_q, d).to(Q.dtype), dk.reshape(*lead, n_k, d).to(K.dtype),
            dv.reshape(*lead, n_k, d).to(V.dtype))


class FlashAttention2Torch(torch.autograd.Function):
    """Tiled FlashAttention-2 in PyTorch. ``apply(Q, K, V, is_causal=False) -> O``; causal is top-left
    aligned (query i sees keys 0..i). Saves L (shape ``Q.shape[:-1]``), Q, K, V, O for the backward."""

    @staticmethod
    def forward(ctx, Q: Tensor, K: Tensor, V: Tensor, is_causal: bool = False) -> Tensor:
        check_is_causal(is_causal)
        check_attention_inputs(Q, K, V, extra_dtypes=(torch.float64,))
        O, L = tiled_forward(Q, K, V, is_causal)
        ctx.save_for_backward(L, Q, K, V, O)
        ctx.is_causal = is_causal
        return O

    @staticmethod
    def backward(ctx, dO: Tensor):
        L, Q, K, V, O = ctx.saved_tensors
        dQ, dK, dV = recompute_backward(Q, K, V, O, dO, L, ctx.is_causal)
        return dQ, dK, dV, None


flash_attention_torch = FlashAttention2Torch.apply


@register_attention_backend("flash_torch")
def flash_torch_attention(q: Tensor, k: Tensor, v: Tensor, is_causal: bool, *, window=None,
                          doc_ids: Tensor | None = None) -> Tensor:
    """Attention backend ``flash_torch``: q (B, Hq, T, d), k and v (B, Hkv, T, d). Grouped heads run by repeating
    each key/value head for its query heads (a copy; autograd sums the copies' gradients); windows and documents
    are not supported here (``ValueError``: use ``flash_triton``)."""
    if window is not None or doc_ids is not None:
        raise ValueError("the flash_torch backend supports neither window nor doc_ids; use flash_triton "
                         "(cs336_systems.attention.flash_attention) or sdpa")
    check_attention_inputs(q, k, v, extra_dtypes=(torch.float64,), grouped=True)
    if q.ndim >= 3 and k.shape[-3] != q.shape[-3]:
        group = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(group, dim=-3), v.repeat_interleave(group, dim=-3)
    return FlashAttention2Torch.apply(q, k, v, is_causal)
