"""RoPE as one Triton kernel per tensor, for ``cs336_basics.model.RotaryEmbedding`` on CUDA.

``use_triton_rope(model)`` makes the model's rotary embedding rotate with :func:`rotate` (``rotate(x, cos, sin)``,
the same arithmetic as ``RotaryEmbedding.forward``: fp32, one rounding to ``x``'s dtype). Why a kernel of our
own: compiled from the module's ``stack`` of the two rotated halves, Inductor reads every input pair with scalar
loads, twice (once per output element of the pair), and gathers cos and sin by position with a bounds check per
element: at xl/2048 on an H100 its forward ran at about 1.7 TB/s and its backward at 2.3. Here each program
reads a tile of whole head vectors as contiguous 32-bit words, one (even, odd) pair of a 16-bit ``x`` each (other
dtypes: loaded as rows and split into pairs in registers), rotates them with the tile's rows of the small cos / sin
tables (gathered by position once per step, outside the kernel) and writes the words back: 2.8 TB/s there
(``scripts/device/rope_bench.py``). The backward is the same kernel rotating by minus the angle. Registered as a
``torch.library.triton_op``, so ``torch.compile`` launches the kernel from its own code (no graph break).

Rows of ``x`` (its last dim, the head dim) map to rows of the cos / sin tables by broadcasting: the tables'
leading shape must equal a suffix of ``x``'s leading shape followed by size-1 dims (as in the model: tables
``(T, 1, Dh/2)`` against ``x`` of ``(B, T, H, Dh)``); other layouts take the module's own PyTorch path.
"""

from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl
from torch import Tensor, nn

from cs336_basics.model import RotaryEmbedding, rotate_pairs
from cs336_systems.fused import install_kernel

_INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"  # Triton's CPU interpreter (the tests)


@triton.jit
def _rope_kernel(x_ptr, cos_ptr, sin_ptr, out_ptr, n_rows, heads, n_pos, HALF: tl.constexpr,
                 BLOCK_HALF: tl.constexpr, BLOCK_ROWS: tl.constexpr, INVERSE: tl.constexpr):
    """Rotate BLOCK_ROWS rows of 2 * HALF values: pairs (x[2k], x[2k+1]) by the angle of row // heads (mod n_pos)
    and frequency k; INVERSE rotates by minus the angle (the backward)."""
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    cols = tl.arange(0, 2 * BLOCK_HALF)
    row_ok = rows < n_rows
    mask = row_ok[:, None] & (cols < 2 * HALF)[None, :]
    offs = rows.to(tl.int64)[:, None] * (2 * HALF) + cols[None, :]
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    x_even, x_odd = tl.split(tl.reshape(x, (BLOCK_ROWS, BLOCK_HALF, 2)))
    k = tl.arange(0, BLOCK_HALF)
    table = ((rows // heads) % n_pos).to(tl.int64)[:, None] * HALF + k[None, :]
    table_mask = row_ok[:, None] & (k < HALF)[None, :]
    cos = tl.load(cos_ptr + table, mask=table_mask, other=0.0)
    sin = tl.load(sin_ptr + table, mask=table_mask, other=0.0)
    if INVERSE:
        sin = -sin
    out_even = x_even * cos - x_odd * sin
    out_odd = x_even * sin + x_odd * cos
    out = tl.reshape(tl.join(out_even, out_odd), (BLOCK_ROWS, 2 * BLOCK_HALF))
    tl.store(out_ptr + offs, out.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rope_pairs_kernel(x_ptr, cos_ptr, sin_ptr, out_ptr, n_rows, heads, n_pos, HALF: tl.constexpr,
                       BLOCK_HALF: tl.constexpr, BLOCK_ROWS: tl.constexpr, INVERSE: tl.constexpr,
                       DTYPE: tl.constexpr):
    """``_rope_kernel`` for 16-bit ``x`` read and written as 32-bit words, one (even, odd) pair each (little
    endian: the even value in the low half), unpacked and packed with bit operations in registers."""
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    k = tl.arange(0, BLOCK_HALF)
    mask = (rows < n_rows)[:, None] & (k < HALF)[None, :]
    offs = rows.to(tl.int64)[:, None] * HALF + k[None, :]
    words = tl.load(x_ptr.to(tl.pointer_type(tl.int32)) + offs, mask=mask, other=0)
    x_even = (words & 0xFFFF).to(tl.int16).to(DTYPE, bitcast=True).to(tl.float32)
    x_odd = ((words >> 16) & 0xFFFF).to(tl.int16).to(DTYPE, bitcast=True).to(tl.float32)
    table = ((rows // heads) % n_pos).to(tl.int64)[:, None] * HALF + k[None, :]
    cos = tl.load(cos_ptr + table, mask=mask, other=0.0)
    sin = tl.load(sin_ptr + table, mask=mask, other=0.0)
    if INVERSE:
        sin = -sin
    out_even = (x_even * cos - x_odd * sin).to(DTYPE).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    out_odd = (x_even * sin + x_odd * cos).to(DTYPE).to(tl.int16, bitcast=True).to(tl.int32)
    tl.store(out_ptr.to(tl.pointer_type(tl.int32)) + offs, out_even | (out_odd << 16), mask=mask)


BLOCK_VALUES, NUM_WARPS = 4096, 4  # values of x a program rotates; warps a program
_PAIR_DTYPES = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


def _launch(x: Tensor, cos: Tensor, sin: Tensor, heads: int, inverse: bool) -> Tensor:
    x = x.contiguous()
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    half = cos.shape[-1]
    n_rows = x.numel() // (2 * half)
    block_half = triton.next_power_of_2(half)
    block_rows = max(1, BLOCK_VALUES // (2 * block_half))
    grid = (triton.cdiv(n_rows, block_rows),)
    # 32-bit words need 4-byte aligned rows: an even offset into an (aligned) allocation; data_ptr() would not trace
    if x.dtype in _PAIR_DTYPES and x.storage_offset() % 2 == 0:
        torch.library.wrap_triton(_rope_pairs_kernel)[grid](
            x, cos, sin, out, n_rows, heads, cos.numel() // half, HALF=half,
            BLOCK_HALF=block_half, BLOCK_ROWS=block_rows, INVERSE=inverse, DTYPE=_PAIR_DTYPES[x.dtype],
            num_warps=NUM_WARPS)
        return out
    torch.library.wrap_triton(_rope_kernel)[grid](
        x, cos, sin, out, n_rows, heads, cos.numel() // half, HALF=half, BLOCK_HALF=block_half,
        BLOCK_ROWS=block_rows, INVERSE=inverse, num_warps=NUM_WARPS)
    return out


@torch.library.triton_op("cs336_systems::rope_rotate", mutates_args=())
def _rope_rotate(x: Tensor, cos: Tensor, sin: Tensor, heads: int, inverse: bool) -> Tensor:
    """``x`` (..., 2 * H') rotated by the angles whose cos and sin are the rows of ``cos`` / ``sin`` ``(P, H')``
    (contiguous fp32): row r of ``x`` uses table row ``(r // heads) % P``."""
    return _launch(x, cos, sin, heads, inverse)


def _setup_context(ctx, inputs, output) -> None:
    _, ctx.cos, ctx.sin, ctx.heads, ctx.inverse = inputs


def _backward(ctx, grad: Tensor):
    # the rotation is orthogonal: its transpose is the rotation by minus the angle
    return _rope_rotate(grad, ctx.cos, ctx.sin, ctx.heads, not ctx.inverse), None, None, None, None


_rope_rotate.register_autograd(_backward, setup_context=_setup_context)


def _table_layout(x_shape: tuple[int, ...], table_shape: tuple[int, ...]) -> int | None:
    """``heads`` (the x rows that share one table row) when the tables' rows map to ``x``'s rows as
    ``(row // heads) % P``, else None: the tables' leading shape, right-aligned with ``x``'s, is size-1 dims
    ahead (broadcast), then equal dims, then size-1 dims (heads)."""
    lead, table = list(x_shape[:-1]), list(table_shape[:-1])
    if len(table) > len(lead):
        return None
    table = [1] * (len(lead) - len(table)) + table
    i = len(lead)
    while i > 0 and table[i - 1] == 1:
        i -= 1
    heads = math.prod(lead[i:])
    j = i
    while j > 0 and table[j - 1] == lead[j - 1]:
        j -= 1
    return heads if all(t == 1 for t in table[:j]) else None


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """``x`` (..., Dh) with pairs (x[2k], x[2k+1]) rotated by the angles of ``cos`` / ``sin`` (..., Dh/2),
    broadcastable against ``x`` as ``RotaryEmbedding.forward`` gathers them; the Triton kernel where the layout
    allows (:func:`_table_layout`), else the module's own arithmetic (``rotate_pairs``)."""
    heads = _table_layout(tuple(x.shape), tuple(cos.shape)) if cos.shape == sin.shape else None
    if heads is None or x.shape[-1] != 2 * cos.shape[-1] or not (x.is_cuda or _INTERPRETING):
        return rotate_pairs(x, cos, sin)
    half = cos.shape[-1]
    table = lambda t: t.float().reshape(-1, half).contiguous()  # (P, Dh/2): a no-op for the model's tables
    return _rope_rotate(x, table(cos), table(sin), heads, False)


def use_triton_rope(model: nn.Module) -> int:
    """Make every ``RotaryEmbedding`` in ``model`` rotate with :func:`rotate`; returns how many it found."""
    return install_kernel(model, RotaryEmbedding, rotate)
