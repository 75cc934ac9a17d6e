Output code: 
# AOT ID: ['0_forward']
from ctypes import c_void_p, c_long, c_int
import torch
import math
import random
import os
import tempfile
from math import inf, nan
from cmath import nanj
from torch._inductor.hooks import run_intermediate_hooks
from torch._inductor.utils import maybe_profile
from torch._inductor.codegen.memory_planning import _align as align
from torch import device, empty_strided
from torch._inductor.async_compile import AsyncCompile
from torch._inductor.select_algorithm import extern_kernels
import triton
import triton.language as tl
from torch._inductor.runtime.triton_heuristics import start_graph, end_graph
from torch._C import _cuda_getCurrentRawStream as get_raw_stream

aten = torch.ops.aten
inductor_ops = torch.ops.inductor
_quantized = torch.ops._quantized
assert_size_stride = torch._C._dynamo.guards.assert_size_stride
assert_alignment = torch._C._dynamo.guards.assert_alignment
empty_strided_cpu = torch._C._dynamo.guards._empty_strided_cpu
empty_strided_cpu_pinned = torch._C._dynamo.guards._empty_strided_cpu_pinned
empty_strided_cuda = torch._C._dynamo.guards._empty_strided_cuda
empty_strided_xpu = torch._C._dynamo.guards._empty_strided_xpu
empty_strided_mtia = torch._C._dynamo.guards._empty_strided_mtia
reinterpret_tensor = torch._C._dynamo.guards._reinterpret_tensor
alloc_from_pool = torch.ops.inductor._alloc_from_pool
async_compile = AsyncCompile()
empty_strided_p2p = torch._C._distributed_c10d._SymmetricMemory.empty_strided_p2p


# kernel path: /tmp/torchinductor_root/lj/cljpnkqt7oldfemww5aqlb4so646jyyzdiykmkebct7ib3xjmkfb.py
# Topologically Sorted Source Nodes: [x, pow_1, mean, add, rms_inv, mul, mul_1, to], Original ATen: [aten._to_copy, aten.pow, aten.mean, aten.add, aten.rsqrt, aten.mul]
# Source node to ATen node mapping:
#   add => add
#   mean => mean
#   mul => mul
#   mul_1 => mul_1
#   pow_1 => pow_1
#   rms_inv => rsqrt
#   to => convert_element_type_1
#   x => convert_element_type
# Graph fragment:
#   %primals_1 : Tensor "bf16[4, 2048, 1600][3276800, 1600, 1]cuda:0" = PlaceHolder[target=primals_1]
#   %buf0 : Tensor "f32[4, 2048, 1][2048, 1, 8192]cuda:0" = PlaceHolder[target=buf0]
#   %rsqrt : Tensor "f32[4, 2048, 1][2048, 1, 1]cuda:0" = PlaceHolder[target=rsqrt]
#   %primals_2 : Tensor "f32[1600][1]cuda:0" = PlaceHolder[target=primals_2]
#   %convert_element_type : Tensor "f32[4, 2048, 1600][3276800, 1600, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%primals_1, torch.float32), kwargs = {})
#   %pow_1 : Tensor "f32[4, 2048, 1600][3276800, 1600, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.pow.Tensor_Scalar](args = (%convert_element_type, 2), kwargs = {})
#   %mean : Tensor "f32[4, 2048, 1][2048, 1, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mean.dim](args = (%pow_1, [-1], True), kwargs = {})
#   %add : Tensor "f32[4, 2048, 1][2048, 1, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.add.Tensor](args = (%mean, 1e-05), kwargs = {})
#   %rsqrt : Tensor "f32[4, 2048, 1][2048, 1, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.rsqrt.default](args = (%add,), kwargs = {})
#   %mul : Tensor "f32[4, 2048, 1600][3276800, 1600, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%convert_element_type, %rsqrt), kwargs = {})
#   %mul_1 : Tensor "f32[4, 2048, 1600][3276800, 1600, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%mul, %primals_2), kwargs = {})
#   %convert_element_type_1 : Tensor "bf16[4, 2048, 1600][3276800, 1600, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%mul_1, torch.bfloat16), kwargs = {})
#   return %buf0,%rsqrt,%convert_element_type_1
triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0 = async_compile.triton('triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0', '''
import triton
import triton.language as tl

from torch._inductor.runtime import triton_helpers, triton_heuristics
from torch._inductor.runtime.triton_helpers import libdevice, math as tl_math
from torch._inductor.runtime.hints import AutotuneHint, ReductionHint, TileHint, DeviceProperties
triton_helpers.set_driver_to_gpu()

@triton_heuristics.reduction(
    size_hints={'x': 8192, 'r0_': 2048},
    reduction_hint=ReductionHint.INNER,
    filename=__file__,
    triton_meta={'signature': {'in_out_ptr0': '*fp32', 'in_ptr0': '*bf16', 'in_ptr1': '*fp32', 'out_ptr0': '*bf16', 'xnumel': 'i32', 'r0_numel': 'i32', 'XBLOCK': 'constexpr', 'R0_BLOCK': 'constexpr'}, 'device': DeviceProperties(type='cuda', index=0, multi_processor_count=132, cc=90, major=9, regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048, max_threads_per_block=1024, warp_size=32), 'constants': {}, 'native_matmul': False, 'enable_fp_fusion': True, 'launch_pdl': False, 'disable_ftz': False, 'configs': [{(0,): [['tt.divisibility', 16]], (1,): [['tt.divisibility', 16]], (2,): [['tt.divisibility', 16]], (3,): [['tt.divisibility', 16]], (4,): [['tt.divisibility', 16]], (5,): [['tt.divisibility', 16]]}]},
    inductor_meta={'grid_type': 'Grid1D', 'autotune_hints': set(), 'kernel_name': 'triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0', 'mutated_arg_names': ['in_out_ptr0'], 'optimize_mem': False, 'no_x_dim': False, 'atomic_add_found': False, 'num_load': 3, 'num_store': 2, 'num_reduction': 1, 'backend_hash': '91D1D1166449D9E2EB66EB9770C9E2C3B0FEB787341F27FEB4D3F0338DA50336', 'assert_indirect_indexing': True, 'autotune_local_cache': True, 'autotune_pointwise': True, 'autotune_remote_cache': None, 'force_disable_caches': False, 'dynamic_scale_rblock': True, 'max_autotune': False, 'max_autotune_pointwise': False, 'min_split_scan_rblock': 256, 'spill_threshold': 16, 'store_cubin': False, 'deterministic': False, 'force_filter_reduction_configs': False, 'mix_order_reduction_allow_multi_stages': False, 'are_deterministic_algorithms_enabled': False, 'tiling_scores': {'x': 65536, 'r0_': 78649600}}
)
@triton.jit
def triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0(in_out_ptr0, in_ptr0, in_ptr1, out_ptr0, xnumel, r0_numel, XBLOCK : tl.constexpr, R0_BLOCK : tl.constexpr):
    xnumel = 8192
    r0_numel = 1600
    rnumel = r0_numel
    RBLOCK: tl.constexpr = R0_BLOCK
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:, None]
    xmask = tl.full([XBLOCK], True, tl.int1)[:, None]
    r0_base = tl.arange(0, R0_BLOCK)[None, :]
    rbase = r0_base
    x0 = xindex
    _tmp4 = tl.full([XBLOCK, R0_BLOCK], 0, tl.float32)
    for r0_offset in tl.range(0, r0_numel, R0_BLOCK):
        r0_index = r0_offset + r0_base
        r0_mask = r0_index < r0_numel
        roffset = r0_offset
        rindex = r0_index
        r0_1 = r0_index
        tmp0 = tl.load(in_ptr0 + (r0_1 + 1600*x0), r0_mask, eviction_policy='evict_last', other=0.0).to(tl.float32)
        tmp1 = tmp0.to(tl.float32)
        tmp2 = tmp1 * tmp1
        tmp3 = tl.broadcast_to(tmp2, [XBLOCK, R0_BLOCK])
        tmp5 = _tmp4 + tmp3
        _tmp4 = tl.where(r0_mask, tmp5, _tmp4)
    tmp4 = tl.sum(_tmp4, 1)[:, None]
    tmp6 = tl.full([1, 1], 1600.0, tl.float32)
    tmp7 = (tmp4 / tmp6)
    tmp8 = tl.full([1, 1], 1e-05, tl.float32)
    tmp9 = tmp7 + tmp8
    tmp10 = libdevice.rsqrt(tmp9)
    tl.debug_barrier()
    tl.store(in_out_ptr0 + (x0), tmp10, None)
    for r0_offset in tl.range(0, r0_numel, R0_BLOCK):
        r0_index = r0_offset + r0_base
        r0_mask = r0_index < r0_numel
        roffset = r0_offset
        rindex = r0_index
        r0_1 = r0_index
        tmp11 = tl.load(in_ptr0 + (r0_1 + 1600*x0), r0_mask, eviction_policy='evict_first', other=0.0).to(tl.float32)
        tmp14 = tl.load(in_ptr1 + (r0_1), r0_mask, eviction_policy='evict_last', other=0.0)
        tmp12 = tmp11.to(tl.float32)
        tmp13 = tmp12 * tmp10
        tmp15 = tmp13 * tmp14
        tmp16 = tmp15.to(tl.float32)
        tl.store(out_ptr0 + (r0_1 + 1600*x0), tmp16, r0_mask)
''', device_str='cuda')


# kernel path: /tmp/torchinductor_root/ih/cihlivatanycub3e33qh5h3md34dv3huayqmrtpjstiipxjkcy7r.py
# Topologically Sorted Source Nodes: [matmul, q, matmul_1, k, pos, cos, sin, getitem_2, x_even, getitem_3, x_odd, mul_2, mul_3, sub, mul_4, mul_5, add_1, rotated, flatten, q_1, getitem_6, x_even_1, getitem_7, x_odd_1, mul_6, mul_7, sub_1, mul_8, mul_9, add_2, rotated_1, flatten_1, k_1], Original ATen: [aten._unsafe_view, aten.view, aten.unsqueeze, aten.index, aten.slice, aten._to_copy, aten.mul, aten.sub, aten.add, aten.stack]
# Source node to ATen node mapping:
#   add_1 => add_1
#   add_2 => add_2
#   cos => index
#   flatten => view_9
#   flatten_1 => view_10
#   getitem_2 => slice_1
#   getitem_3 => slice_2
#   getitem_6 => slice_3
#   getitem_7 => slice_4
#   k => view_5
#   k_1 => convert_element_type_13
#   matmul => view_1
#   matmul_1 => view_4
#   mul_2 => mul_2
#   mul_3 => mul_3
#   mul_4 => mul_4
#   mul_5 => mul_5
#   mul_6 => mul_6
#   mul_7 => mul_7
#   mul_8 => mul_8
#   mul_9 => mul_9
#   pos => unsqueeze
#   q => view_2
#   q_1 => convert_element_type_10
#   rotated => cat, unsqueeze_1, unsqueeze_2
#   rotated_1 => cat_1, unsqueeze_3, unsqueeze_4
#   sin => index_1
#   sub => sub
#   sub_1 => sub_1
#   x_even => convert_element_type_8
#   x_even_1 => convert_element_type_11
#   x_odd => convert_element_type_9
#   x_odd_1 => convert_element_type_12
# Graph fragment:
#   %mm : Tensor "bf16[8192, 1600][1600, 1]cuda:0" = PlaceHolder[target=mm]
#   %primals_6 : Tensor "i64[2048][1]cuda:0" = PlaceHolder[target=primals_6]
#   %primals_7 : Tensor "f32[2048, 32][32, 1]cuda:0" = PlaceHolder[target=primals_7]
#   %primals_8 : Tensor "f32[2048, 32][32, 1]cuda:0" = PlaceHolder[target=primals_8]
#   %mm_1 : Tensor "bf16[8192, 1600][1600, 1]cuda:0" = PlaceHolder[target=mm_1]
#   %view_1 : Tensor "bf16[4, 2048, 1600][3276800, 1600, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.reshape.default](args = (%mm, [4, 2048, 1600]), kwargs = {})
#   %view_2 : Tensor "bf16[4, 2048, 25, 64][3276800, 1600, 64, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.reshape.default](args = (%view_1, [4, 2048, 25, 64]), kwargs = {})
#   %view_4 : Tensor "bf16[4, 2048, 1600][3276800, 1600, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.reshape.default](args = (%mm_1, [4, 2048, 1600]), kwargs = {})
#   %view_5 : Tensor "bf16[4, 2048, 25, 64][3276800, 1600, 64, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.reshape.default](args = (%view_4, [4, 2048, 25, 64]), kwargs = {})
#   %unsqueeze : Tensor "i64[2048, 1][1, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.unsqueeze.default](args = (%primals_6, -1), kwargs = {})
#   %index : Tensor "f32[2048, 1, 32][32, 32, 1]cuda:0"[num_users=4] = call_function[target=torch.ops.aten.index.Tensor](args = (%primals_7, [%unsqueeze]), kwargs = {})
#   %index_1 : Tensor "f32[2048, 1, 32][32, 32, 1]cuda:0"[num_users=4] = call_function[target=torch.ops.aten.index.Tensor](args = (%primals_8, [%unsqueeze]), kwargs = {})
#   %slice_1 : Tensor "bf16[4, 2048, 25, 32][3276800, 1600, 64, 2]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.slice.Tensor](args = (%view_2, 3, 0, 9223372036854775807, 2), kwargs = {})
#   %convert_element_type_8 : Tensor "f32[4, 2048, 25, 32][1638400, 800, 32, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%slice_1, torch.float32), kwargs = {})
#   %slice_2 : Tensor "bf16[4, 2048, 25, 32][3276800, 1600, 64, 2]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.slice.Tensor](args = (%view_2, 3, 1, 9223372036854775807, 2), kwargs = {})
#   %convert_element_type_9 : Tensor "f32[4, 2048, 25, 32][1638400, 800, 32, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%slice_2, torch.float32), kwargs = {})
#   %mul_2 : Tensor "f32[4, 2048, 25, 32][1638400, 800, 32, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%convert_element_type_8, %index), kwargs = {})
#   %mul_3 : Tensor "f32[4, 2048, 25, 32][1638400, 800, 32, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%convert_element_type_9, %index_1), kwargs = {})
#   %sub : Tensor "f32[4, 2048, 25, 32][1638400, 800, 32, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.sub.Tensor](args = (%mul_2, %mul_3), kwargs = {})
#   %mul_4 : Tensor "f32[4, 2048, 25, 32][1638400, 800, 32, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%convert_element_type_8, %index_1), kwargs = {})
#   %mul_5 : Tensor "f32[4, 2048, 25, 32][1638400, 800, 32, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%convert_element_type_9, %index), kwargs = {})
#   %add_1 : Tensor "f32[4, 2048, 25, 32][1638400, 800, 32, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.add.Tensor](args = (%mul_4, %mul_5), kwargs = {})
#   %unsqueeze_1 : Tensor "f32[4, 2048, 25, 32, 1][1638400, 800, 32, 1, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.unsqueeze.default](args = (%sub, 4), kwargs = {})
#   %unsqueeze_2 : Tensor "f32[4, 2048, 25, 32, 1][1638400, 800, 32, 1, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.unsqueeze.default](args = (%add_1, 4), kwargs = {})
#   %cat : Tensor "f32[4, 2048, 25, 32, 2][3276800, 1600, 64, 2, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.cat.default](args = ([%unsqueeze_1, %unsqueeze_2], -1), kwargs = {})
#   %view_9 : Tensor "f32[4, 2048, 25, 64][3276800, 1600, 64, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.reshape.default](args = (%cat, [4, 2048, 25, 64]), kwargs = {})
#   %convert_element_type_10 : Tensor "bf16[4, 2048, 25, 64][3276800, 1600, 64, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%view_9, torch.bfloat16), kwargs = {})
#   %slice_3 : Tensor "bf16[4, 2048, 25, 32][3276800, 1600, 64, 2]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.slice.Tensor](args = (%view_5, 3, 0, 9223372036854775807, 2), kwargs = {})
#   %convert_element_type_11 : Tensor "f32[4, 2048, 25, 32][1638400, 800, 32, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%slice_3, torch.float32), kwargs = {})
#   %slice_4 : Tensor "bf16[4, 2048, 25, 32][3276800, 1600, 64, 2]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.slice.Tensor](args = (%view_5, 3, 1, 9223372036854775807, 2), kwargs = {})
#   %convert_element_type_12 : Tensor "f32[4, 2048, 25, 32][1638400, 800, 32, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%slice_4, torch.float32), kwargs = {})
#   %mul_6 : Tensor "f32[4, 2048, 25, 32][1638400, 800, 32, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%convert_element_type_11, %index), kwargs = {})
#   %mul_7 : Tensor "f32[4, 2048, 25, 32][1638400, 800, 32, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%convert_element_type_12, %index_1), kwargs = {})
#   %sub_1 : Tensor "f32[4, 2048, 25, 32][1638400, 800, 32, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.sub.Tensor](args = (%mul_6, %mul_7), kwargs = {})
#   %mul_8 : Tensor "f32[4, 2048, 25, 32][1638400, 800, 32, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%convert_element_type_11, %index_1), kwargs = {})
#   %mul_9 : Tensor "f32[4, 2048, 25, 32][1638400, 800, 32, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%convert_element_type_12, %index), kwargs = {})
#   %add_2 : Tensor "f32[4, 2048, 25, 32][1638400, 800, 32, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.add.Tensor](args = (%mul_8, %mul_9), kwargs = {})
#   %unsqueeze_3 : Tensor "f32[4, 2048, 25, 32, 1][1638400, 800, 32, 1, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.unsqueeze.default](args = (%sub_1, 4), kwargs = {})
#   %unsqueeze_4 : Tensor "f32[4, 2048, 25, 32, 1][1638400, 800, 32, 1, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.unsqueeze.default](args = (%add_2, 4), kwargs = {})
#   %cat_1 : Tensor "f32[4, 2048, 25, 32, 2][3276800, 1600, 64, 2, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.cat.default](args = ([%unsqueeze_3, %unsqueeze_4], -1), kwargs = {})
#   %view_10 : Tensor "f32[4, 2048, 25, 64][3276800, 1600, 64, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.reshape.default](args = (%cat_1, [4, 2048, 25, 64]), kwargs = {})
#   %convert_element_type_13 : Tensor "bf16[4, 2048, 25, 64][3276800, 1600, 64, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%view_10, torch.bfloat16), kwargs = {})
#   return %convert_element_type_10,%convert_element_type_13
triton_poi_fused__to_copy__unsafe_view_add_index_mul_slice_stack_sub_unsqueeze_view_1 = async_compile.triton('triton_poi_fused__to_copy__unsafe_view_add_index_mul_slice_stack_sub_unsqueeze_view_1', '''
import triton
import triton.language as tl

from torch._inductor.runtime import triton_helpers, triton_heuristics
from torch._inductor.runtime.triton_helpers import libdevice, math as tl_math
from torch._inductor.runtime.hints import AutotuneHint, ReductionHint, TileHint, DeviceProperties
triton_helpers.set_driver_to_gpu()

@triton_heuristics.pointwise(
    size_hints={'x': 16777216}, 
    filename=__file__,
    triton_meta={'signature': {'in_ptr0': '*bf16', 'in_ptr1': '*i64', 'in_ptr2': '*fp32', 'in_ptr3': '*fp32', 'in_ptr4': '*bf16', 'out_ptr0': '*bf16', 'out_ptr1': '*bf16', 'xnumel': 'i32', 'XBLOCK': 'constexpr'}, 'device': DeviceProperties(type='cuda', index=0, multi_processor_count=132, cc=90, major=9, regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048, max_threads_per_block=1024, warp_size=32), 'constants': {}, 'native_matmul': False, 'enable_fp_fusion': True, 'launch_pdl': False, 'disable_ftz': False, 'configs': [{(0,): [['tt.divisibility', 16]], (1,): [['tt.divisibility', 16]], (2,): [['tt.divisibility', 16]], (3,): [['tt.divisibility', 16]], (4,): [['tt.divisibility', 16]], (5,): [['tt.divisibility', 16]], (6,): [['tt.divisibility', 16]], (7,): [['tt.divisibility', 16]]}]},
    inductor_meta={'grid_type': 'Grid1D', 'autotune_hints': set(), 'kernel_name': 'triton_poi_fused__to_copy__unsafe_view_add_index_mul_slice_stack_sub_unsqueeze_view_1', 'mutated_arg_names': [], 'optimize_mem': False, 'no_x_dim': False, 'atomic_add_found': False, 'num_load': 10, 'num_store': 2, 'num_reduction': 0, 'backend_hash': '91D1D1166449D9E2EB66EB9770C9E2C3B0FEB787341F27FEB4D3F0338DA50336', 'assert_indirect_indexing': True, 'autotune_local_cache': True, 'autotune_pointwise': True, 'autotune_remote_cache': None, 'force_disable_caches': False, 'dynamic_scale_rblock': True, 'max_autotune': False, 'max_autotune_pointwise': False, 'min_split_scan_rblock': 256, 'spill_threshold': 16, 'store_cubin': False, 'deterministic': False, 'force_filter_reduction_configs': False, 'mix_order_reduction_allow_multi_stages': False, 'are_deterministic_algorithms_enabled': False, 'tiling_scores': {'x': 209715200}},
    min_elem_per_thread=0
)
@triton.jit
def triton_poi_fused__to_copy__unsafe_view_add_index_mul_slice_stack_sub_unsqueeze_view_1(in_ptr0, in_ptr1, in_ptr2, in_ptr3, in_ptr4, out_ptr0, out_ptr1, xnumel, XBLOCK : tl.constexpr):
    xnumel = 13107200
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:]
    xmask = tl.full([XBLOCK], True, tl.int1)[:]
    x5 = xindex
    x0 = (xindex % 64)
    x4 = xindex // 64
    x2 = ((xindex // 1600) % 2048)
    tmp0 = (x5 % 2)
    tmp1 = tl.full([1], 0, tl.int64)
    tmp2 = tmp0 >= tmp1
    tmp3 = tl.full([1], 1, tl.int64)
    tmp4 = tmp0 < tmp3
    tmp5 = tl.load(in_ptr0 + (2*(x0 // 2) + 64*x4), tmp4, eviction_policy='evict_last', other=0.0).to(tl.float32)
    tmp6 = tmp5.to(tl.float32)
    tmp7 = tl.load(in_ptr1 + (x2), tmp4, eviction_policy='evict_last', other=0.0)
    tmp8 = tl.full([XBLOCK], 2048, tl.int32)
    tmp9 = tmp7 + tmp8
    tmp10 = tmp7 < 0
    tmp11 = tl.where(tmp10, tmp9, tmp7)
    tl.device_assert(((0 <= tl.broadcast_to(tmp11, [XBLOCK])) & (tl.broadcast_to(tmp11, [XBLOCK]) < 2048)) | ~(tmp4), "index out of bounds: 0 <= tl.broadcast_to(tmp11, [XBLOCK]) < 2048")
    tmp13 = tl.load(in_ptr2 + (32*tmp11 + (x0 // 2)), tmp4, eviction_policy='evict_last', other=0.0)
    tmp14 = tmp6 * tmp13
    tmp15 = tl.load(in_ptr0 + (1 + 2*(x0 // 2) + 64*x4), tmp4, eviction_policy='evict_last', other=0.0).to(tl.float32)
    tmp16 = tmp15.to(tl.float32)
    tmp17 = tl.load(in_ptr3 + (32*tmp11 + (x0 // 2)), tmp4, eviction_policy='evict_last', other=0.0)
    tmp18 = tmp16 * tmp17
    tmp19 = tmp14 - tmp18
    tmp20 = tl.full(tmp19.shape, 0.0, tmp19.dtype)
    tmp21 = tl.where(tmp4, tmp19, tmp20)
    tmp22 = tmp0 >= tmp3
    tmp23 = tl.full([1], 2, tl.int64)
    tmp24 = tmp0 < tmp23
    tmp25 = tl.load(in_ptr0 + (2*(x0 // 2) + 64*x4), tmp22, eviction_policy='evict_last', other=0.0).to(tl.float32)
    tmp26 = tmp25.to(tl.float32)
    tmp27 = tl.load(in_ptr1 + (x2), tmp22, eviction_policy='evict_last', other=0.0)
    tmp28 = tl.full([XBLOCK], 2048, tl.int32)
    tmp29 = tmp27 + tmp28
    tmp30 = tmp27 < 0
    tmp31 = tl.where(tmp30, tmp29, tmp27)
    tl.device_assert(((0 <= tl.broadcast_to(tmp31, [XBLOCK])) & (tl.broadcast_to(tmp31, [XBLOCK]) < 2048)) | ~(tmp22), "index out of bounds: 0 <= tl.broadcast_to(tmp31, [XBLOCK]) < 2048")
    tmp33 = tl.load(in_ptr3 + (32*tmp31 + (x0 // 2)), tmp22, eviction_policy='evict_last', other=0.0)
    tmp34 = tmp26 * tmp33
    tmp35 = tl.load(in_ptr0 + (1 + 2*(x0 // 2) + 64*x4), tmp22, eviction_policy='evict_last', other=0.0).to(tl.float32)
    tmp36 = tmp35.to(tl.float32)
    tmp37 = tl.load(in_ptr2 + (32*tmp31 + (x0 // 2)), tmp22, eviction_policy='evict_last', other=0.0)
    tmp38 = tmp36 * tmp37
    tmp39 = tmp34 + tmp38
    tmp40 = tl.full(tmp39.shape, 0.0, tmp39.dtype)
    tmp41 = tl.where(tmp22, tmp39, tmp40)
    tmp42 = tl.where(tmp4, tmp21, tmp41)
    tmp43 = tmp42.to(tl.float32)
    tmp44 = tl.load(in_ptr4 + (2*(x0 // 2) + 64*x4), tmp4, eviction_policy='evict_last', other=0.0).to(tl.float32)
    tmp45 = tmp44.to(tl.float32)
    tmp46 = tmp45 * tmp13
    tmp47 = tl.load(in_ptr4 + (1 + 2*(x0 // 2) + 64*x4), tmp4, eviction_policy='evict_last', other=0.0).to(tl.float32)
    tmp48 = tmp47.to(tl.float32)
    tmp49 = tmp48 * tmp17
    tmp50 = tmp46 - tmp49
    tmp51 = tl.full(tmp50.shape, 0.0, tmp50.dtype)
    tmp52 = tl.where(tmp4, tmp50, tmp51)
    tmp53 = tl.load(in_ptr4 + (2*(x0 // 2) + 64*x4), tmp22, eviction_policy='evict_last', other=0.0).to(tl.float32)
    tmp54 = tmp53.to(tl.float32)
    tmp55 = tmp54 * tmp33
    tmp56 = tl.load(in_ptr4 + (1 + 2*(x0 // 2) + 64*x4), tmp22, eviction_policy='evict_last', other=0.0).to(tl.float32)
    tmp57 = tmp56.to(tl.float32)
    tmp58 = tmp57 * tmp37
    tmp59 = tmp55 + tmp58
    tmp60 = tl.full(tmp59.shape, 0.0, tmp59.dtype)
    tmp61 = tl.where(tmp22, tmp59, tmp60)
    tmp62 = tl.where(tmp4, tmp52, tmp61)
    tmp63 = tmp62.to(tl.float32)
    tl.store(out_ptr0 + (x5), tmp43, None)
    tl.store(out_ptr1 + (x5), tmp63, None)
''', device_str='cuda')


# kernel path: /tmp/torchinductor_root/7s/c7s3l235d24ivhzxv3lm2qmhtgd5hdw47sxucnodol3pblaula6s.py
# Topologically Sorted Source Nodes: [matmul_3, x_1, x_2, pow_2, mean_1, add_4, rms_inv_1, mul_10, mul_11, to_3], Original ATen: [aten._unsafe_view, aten.add, aten._to_copy, aten.pow, aten.mean, aten.rsqrt, aten.mul]
# Source node to ATen node mapping:
#   add_4 => add_4
#   matmul_3 => view_13
#   mean_1 => mean_1
#   mul_10 => mul_10
#   mul_11 => mul_11
#   pow_2 => pow_2
#   rms_inv_1 => rsqrt_1
#   to_3 => convert_element_type_17
#   x_1 => add_3
#   x_2 => convert_element_type_16
# Graph fragment:
#   %primals_1 : Tensor "bf16[4, 2048, 1600][3276800, 1600, 1]cuda:0" = PlaceHolder[target=primals_1]
#   %mm_3 : Tensor "bf16[8192, 1600][1600, 1]cuda:0" = PlaceHolder[target=mm_3]
#   %buf14 : Tensor "f32[4, 2048, 1][2048, 1, 8192]cuda:0" = PlaceHolder[target=buf14]
#   %rsqrt_1 : Tensor "f32[4, 2048, 1][2048, 1, 1]cuda:0" = PlaceHolder[target=rsqrt_1]
#   %primals_10 : Tensor "f32[1600][1]cuda:0" = PlaceHolder[target=primals_10]
#   %view_13 : Tensor "bf16[4, 2048, 1600][3276800, 1600, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.reshape.default](args = (%mm_3, [4, 2048, 1600]), kwargs = {})
#   %add_3 : Tensor "bf16[4, 2048, 1600][3276800, 1600, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.add.Tensor](args = (%primals_1, %view_13), kwargs = {})
#   %convert_element_type_16 : Tensor "f32[4, 2048, 1600][3276800, 1600, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%add_3, torch.float32), kwargs = {})
#   %pow_2 : Tensor "f32[4, 2048, 1600][3276800, 1600, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.pow.Tensor_Scalar](args = (%convert_element_type_16, 2), kwargs = {})
#   %mean_1 : Tensor "f32[4, 2048, 1][2048, 1, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mean.dim](args = (%pow_2, [-1], True), kwargs = {})
#   %add_4 : Tensor "f32[4, 2048, 1][2048, 1, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.add.Tensor](args = (%mean_1, 1e-05), kwargs = {})
#   %rsqrt_1 : Tensor "f32[4, 2048, 1][2048, 1, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.rsqrt.default](args = (%add_4,), kwargs = {})
#   %mul_10 : Tensor "f32[4, 2048, 1600][3276800, 1600, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%convert_element_type_16, %rsqrt_1), kwargs = {})
#   %mul_11 : Tensor "f32[4, 2048, 1600][3276800, 1600, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%mul_10, %primals_10), kwargs = {})
#   %convert_element_type_17 : Tensor "bf16[4, 2048, 1600][3276800, 1600, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%mul_11, torch.bfloat16), kwargs = {})
#   return %buf14,%rsqrt_1,%convert_element_type_17
triton_red_fused__to_copy__unsafe_view_add_mean_mul_pow_rsqrt_2 = async_compile.triton('triton_red_fused__to_copy__unsafe_view_add_mean_mul_pow_rsqrt_2', '''
import triton
import triton.language as tl

from torch._inductor.runtime import triton_helpers, triton_heuristics
from torch._inductor.runtime.triton_helpers import libdevice, math as tl_math
from torch._inductor.runtime.hints import AutotuneHint, ReductionHint, TileHint, DeviceProperties
triton_helpers.set_driver_to_gpu()

@triton_heuristics.reduction(
    size_hints={'x': 8192, 'r0_': 2048},
    reduction_hint=ReductionHint.INNER,
    filename=__file__,
    triton_meta={'signature': {'in_out_ptr0': '*fp32', 'in_ptr0': '*bf16', 'in_ptr1': '*bf16', 'in_ptr2': '*fp32', 'out_ptr0': '*bf16', 'xnumel': 'i32', 'r0_numel': 'i32', 'XBLOCK': 'constexpr', 'R0_BLOCK': 'constexpr'}, 'device': DeviceProperties(type='cuda', index=0, multi_processor_count=132, cc=90, major=9, regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048, max_threads_per_block=1024, warp_size=32), 'constants': {}, 'native_matmul': False, 'enable_fp_fusion': True, 'launch_pdl': False, 'disable_ftz': False, 'configs': [{(0,): [['tt.divisibility', 16]], (1,): [['tt.divisibility', 16]], (2,): [['tt.divisibility', 16]], (3,): [['tt.divisibility', 16]], (4,): [['tt.divisibility', 16]], (5,): [['tt.divisibility', 16]], (6,): [['tt.divisibility', 16]]}]},
    inductor_meta={'grid_type': 'Grid1D', 'autotune_hints': set(), 'kernel_name': 'triton_red_fused__to_copy__unsafe_view_add_mean_mul_pow_rsqrt_2', 'mutated_arg_names': ['in_out_ptr0'], 'optimize_mem': False, 'no_x_dim': False, 'atomic_add_found': False, 'num_load': 5, 'num_store': 2, 'num_reduction': 1, 'backend_hash': '91D1D1166449D9E2EB66EB9770C9E2C3B0FEB787341F27FEB4D3F0338DA50336', 'assert_indirect_indexing': True, 'autotune_local_cache': True, 'autotune_pointwise': True, 'autotune_remote_cache': None, 'force_disable_caches': False, 'dynamic_scale_rblock': True, 'max_autotune': False, 'max_autotune_pointwise': False, 'min_split_scan_rblock': 256, 'spill_threshold': 16, 'store_cubin': False, 'deterministic': False, 'force_filter_reduction_configs': False, 'mix_order_reduction_allow_multi_stages': False, 'are_deterministic_algorithms_enabled': False, 'tiling_scores': {'x': 65536, 'r0_': 104864000}}
)
@triton.jit
def triton_red_fused__to_copy__unsafe_view_add_mean_mul_pow_rsqrt_2(in_out_ptr0, in_ptr0, in_ptr1, in_ptr2, out_ptr0, xnumel, r0_numel, XBLOCK : tl.constexpr, R0_BLOCK : tl.constexpr):
    xnumel = 8192
    r0_numel = 1600
    rnumel = r0_numel
    RBLOCK: tl.constexpr = R0_BLOCK
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:, None]
    xmask = tl.full([XBLOCK], True, tl.int1)[:, None]
    r0_base = tl.arange(0, R0_BLOCK)[None, :]
    rbase = r0_base
    x0 = xindex
    _tmp6 = tl.full([XBLOCK, R0_BLOCK], 0, tl.float32)
    for r0_offset in tl.range(0, r0_numel, R0_BLOCK):
        r0_index = r0_offset + r0_base
        r0_mask = r0_index < r0_numel
        roffset = r0_offset
        rindex = r0_index
        r0_1 = r0_index
        tmp0 = tl.load(in_ptr0 + (r0_1 + 1600*x0), r0_mask, eviction_policy='evict_last', other=0.0).to(tl.float32)
        tmp1 = tl.load(in_ptr1 + (r0_1 + 1600*x0), r0_mask, eviction_policy='evict_last', other=0.0).to(tl.float32)
        tmp2 = tmp0 + tmp1
        tmp3 = tmp2.to(tl.float32)
        tmp4 = tmp3 * tmp3
        tmp5 = tl.broadcast_to(tmp4, [XBLOCK, R0_BLOCK])
        tmp7 = _tmp6 + tmp5
        _tmp6 = tl.where(r0_mask, tmp7, _tmp6)
    tmp6 = tl.sum(_tmp6, 1)[:, None]
    tmp8 = tl.full([1, 1], 1600.0, tl.float32)
    tmp9 = (tmp6 / tmp8)
    tmp10 = tl.full([1, 1], 1e-05, tl.float32)
    tmp11 = tmp9 + tmp10
    tmp12 = libdevice.rsqrt(tmp11)
    tl.debug_barrier()
    tl.store(in_out_ptr0 + (x0), tmp12, None)
    for r0_offset in tl.range(0, r0_numel, R0_BLOCK):
        r0_index = r0_offset + r0_base
        r0_mask = r0_index < r0_numel
        roffset = r0_offset
        rindex = r0_index
        r0_1 = r0_index
        tmp13 = tl.load(in_ptr0 + (r0_1 + 1600*x0), r0_mask, eviction_policy='evict_first', other=0.0).to(tl.float32)
        tmp14 = tl.load(in_ptr1 + (r0_1 + 1600*x0), r0_mask, eviction_policy='evict_first', other=0.0).to(tl.float32)
        tmp18 = tl.load(in_ptr2 + (r0_1), r0_mask, eviction_policy='evict_last', other=0.0)
        tmp15 = tmp13 + tmp14
        tmp16 = tmp15.to(tl.float32)
        tmp17 = tmp16 * tmp12
        tmp19 = tmp17 * tmp18
        tmp20 = tmp19.to(tl.float32)
        tl.store(out_ptr0 + (r0_1 + 1600*x0), tmp20, r0_mask)
''', device_str='cuda')


# kernel path: /tmp/torchinductor_root/s3/cs3tsb5g6f34mcu4p7tlnh7rt6w7rwvxrdjr2gnjc5vlr2qm26ci.py
# Topologically Sorted Source Nodes: [matmul_4, sigmoid, mul_12, matmul_5, mul_13], Original ATen: [aten._unsafe_view, aten.sigmoid, aten.mul]
# Source node to ATen node mapping:
#   matmul_4 => view_15
#   matmul_5 => view_17
#   mul_12 => mul_12
#   mul_13 => mul_13
#   sigmoid => sigmoid
# Graph fragment:
#   %mm_4 : Tensor "bf16[8192, 6400][6400, 1]cuda:0" = PlaceHolder[target=mm_4]
#   %mm_5 : Tensor "bf16[8192, 6400][6400, 1]cuda:0" = PlaceHolder[target=mm_5]
#   %view_15 : Tensor "bf16[4, 2048, 6400][13107200, 6400, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.reshape.default](args = (%mm_4, [4, 2048, 6400]), kwargs = {})
#   %sigmoid : Tensor "bf16[4, 2048, 6400][13107200, 6400, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.sigmoid.default](args = (%view_15,), kwargs = {})
#   %mul_12 : Tensor "bf16[4, 2048, 6400][13107200, 6400, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%view_15, %sigmoid), kwargs = {})
#   %view_17 : Tensor "bf16[4, 2048, 6400][13107200, 6400, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.reshape.default](args = (%mm_5, [4, 2048, 6400]), kwargs = {})
#   %mul_13 : Tensor "bf16[4, 2048, 6400][13107200, 6400, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%mul_12, %view_17), kwargs = {})
#   return %mul_13
triton_poi_fused__unsafe_view_mul_sigmoid_3 = async_compile.triton('triton_poi_fused__unsafe_view_mul_sigmoid_3', '''
import triton
import triton.language as tl

from torch._inductor.runtime import triton_helpers, triton_heuristics
from torch._inductor.runtime.triton_helpers import libdevice, math as tl_math
from torch._inductor.runtime.hints import AutotuneHint, ReductionHint, TileHint, DeviceProperties
triton_helpers.set_driver_to_gpu()

@triton_heuristics.pointwise(
    size_hints={'x': 67108864}, 
    filename=__file__,
    triton_meta={'signature': {'in_ptr0': '*bf16', 'in_ptr1': '*bf16', 'out_ptr0': '*bf16', 'xnumel': 'i32', 'XBLOCK': 'constexpr'}, 'device': DeviceProperties(type='cuda', index=0, multi_processor_count=132, cc=90, major=9, regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048, max_threads_per_block=1024, warp_size=32), 'constants': {}, 'native_matmul': False, 'enable_fp_fusion': True, 'launch_pdl': False, 'disable_ftz': False, 'configs': [{(0,): [['tt.divisibility', 16]], (1,): [['tt.divisibility', 16]], (2,): [['tt.divisibility', 16]], (3,): [['tt.divisibility', 16]]}]},
    inductor_meta={'grid_type': 'Grid1D', 'autotune_hints': set(), 'kernel_name': 'triton_poi_fused__unsafe_view_mul_sigmoid_3', 'mutated_arg_names': [], 'optimize_mem': False, 'no_x_dim': False, 'atomic_add_found': False, 'num_load': 2, 'num_store': 1, 'num_reduction': 0, 'backend_hash': '91D1D1166449D9E2EB66EB9770C9E2C3B0FEB787341F27FEB4D3F0338DA50336', 'assert_indirect_indexing': True, 'autotune_local_cache': True, 'autotune_pointwise': True, 'autotune_remote_cache': None, 'force_disable_caches': False, 'dynamic_scale_rblock': True, 'max_autotune': False, 'max_autotune_pointwise': False, 'min_split_scan_rblock': 256, 'spill_threshold': 16, 'store_cubin': False, 'deterministic': False, 'force_filter_reduction_configs': False, 'mix_order_reduction_allow_multi_stages': False, 'are_deterministic_algorithms_enabled': False, 'tiling_scores': {'x': 419430400}},
    min_elem_per_thread=0
)
@triton.jit
def triton_poi_fused__unsafe_view_mul_sigmoid_3(in_ptr0, in_ptr1, out_ptr0, xnumel, XBLOCK : tl.constexpr):
    xnumel = 52428800
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:]
    xmask = tl.full([XBLOCK], True, tl.int1)[:]
    x0 = xindex
    tmp0 = tl.load(in_ptr0 + (x0), None).to(tl.float32)
    tmp3 = tl.load(in_ptr1 + (x0), None).to(tl.float32)
    tmp1 = tl.sigmoid(tmp0)
    tmp2 = tmp0 * tmp1
    tmp4 = tmp2 * tmp3
    tl.store(out_ptr0 + (x0), tmp4, None)
''', device_str='cuda')


# kernel path: /tmp/torchinductor_root/fo/cfolgco2vidcp5dvccfvyuea656coq2w7nonnkzqllyhmmbgk64h.py
# Topologically Sorted Source Nodes: [matmul_3, x_1, matmul_6, add_5], Original ATen: [aten._unsafe_view, aten.add]
# Source node to ATen node mapping:
#   add_5 => add_5
#   matmul_3 => view_13
#   matmul_6 => view_19
#   x_1 => add_3
# Graph fragment:
#   %primals_1 : Tensor "bf16[4, 2048, 1600][3276800, 1600, 1]cuda:0" = PlaceHolder[target=primals_1]
#   %mm_3 : Tensor "bf16[8192, 1600][1600, 1]cuda:0" = PlaceHolder[target=mm_3]
#   %mm_6 : Tensor "bf16[8192, 1600][1600, 1]cuda:0" = PlaceHolder[target=mm_6]
#   %view_13 : Tensor "bf16[4, 2048, 1600][3276800, 1600, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.reshape.default](args = (%mm_3, [4, 2048, 1600]), kwargs = {})
#   %add_3 : Tensor "bf16[4, 2048, 1600][3276800, 1600, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.add.Tensor](args = (%primals_1, %view_13), kwargs = {})
#   %view_19 : Tensor "bf16[4, 2048, 1600][3276800, 1600, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.reshape.default](args = (%mm_6, [4, 2048, 1600]), kwargs = {})
#   %add_5 : Tensor "bf16[4, 2048, 1600][3276800, 1600, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.add.Tensor](args = (%add_3, %view_19), kwargs = {})
#   return %add_5
triton_poi_fused__unsafe_view_add_4 = async_compile.triton('triton_poi_fused__unsafe_view_add_4', '''
import triton
import triton.language as tl

from torch._inductor.runtime import triton_helpers, triton_heuristics
from torch._inductor.runtime.triton_helpers import libdevice, math as tl_math
from torch._inductor.runtime.hints import AutotuneHint, ReductionHint, TileHint, DeviceProperties
triton_helpers.set_driver_to_gpu()

@triton_heuristics.pointwise(
    size_hints={'x': 16777216}, 
    filename=__file__,
    triton_meta={'signature': {'in_out_ptr0': '*bf16', 'in_ptr0': '*bf16', 'in_ptr1': '*bf16', 'xnumel': 'i32', 'XBLOCK': 'constexpr'}, 'device': DeviceProperties(type='cuda', index=0, multi_processor_count=132, cc=90, major=9, regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048, max_threads_per_block=1024, warp_size=32), 'constants': {}, 'native_matmul': False, 'enable_fp_fusion': True, 'launch_pdl': False, 'disable_ftz': False, 'configs': [{(0,): [['tt.divisibility', 16]], (1,): [['tt.divisibility', 16]], (2,): [['tt.divisibility', 16]], (3,): [['tt.divisibility', 16]]}]},
    inductor_meta={'grid_type': 'Grid1D', 'autotune_hints': set(), 'kernel_name': 'triton_poi_fused__unsafe_view_add_4', 'mutated_arg_names': ['in_out_ptr0'], 'optimize_mem': False, 'no_x_dim': False, 'atomic_add_found': False, 'num_load': 3, 'num_store': 1, 'num_reduction': 0, 'backend_hash': '91D1D1166449D9E2EB66EB9770C9E2C3B0FEB787341F27FEB4D3F0338DA50336', 'assert_indirect_indexing': True, 'autotune_local_cache': True, 'autotune_pointwise': True, 'autotune_remote_cache': None, 'force_disable_caches': False, 'dynamic_scale_rblock': True, 'max_autotune': False, 'max_autotune_pointwise': False, 'min_split_scan_rblock': 256, 'spill_threshold': 16, 'store_cubin': False, 'deterministic': False, 'force_filter_reduction_configs': False, 'mix_order_reduction_allow_multi_stages': False, 'are_deterministic_algorithms_enabled': False, 'tiling_scores': {'x': 131072000}},
    min_elem_per_thread=0
)
@triton.jit
def triton_poi_fused__unsafe_view_add_4(in_out_ptr0, in_ptr0, in_ptr1, xnumel, XBLOCK : tl.constexpr):
    xnumel = 13107200
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:]
    xmask = tl.full([XBLOCK], True, tl.int1)[:]
    x0 = xindex
    tmp0 = tl.load(in_ptr0 + (x0), None).to(tl.float32)
    tmp1 = tl.load(in_ptr1 + (x0), None).to(tl.float32)
    tmp3 = tl.load(in_out_ptr0 + (x0), None).to(tl.float32)
    tmp2 = tmp0 + tmp1
    tmp4 = tmp2 + tmp3
    tl.store(in_out_ptr0 + (x0), tmp4, None)
''', device_str='cuda')


async_compile.wait(globals())
del async_compile

class Runner:
    def __init__(self, partitions):
        self.partitions = partitions

    def recursively_apply_fns(self, fns):
        new_callables = []
        for fn, c in zip(fns, self.partitions):
            new_callables.append(fn(c))
        self.partitions = new_callables

    def call(self, args):
        primals_1, primals_2, primals_3, primals_4, primals_5, primals_6, primals_7, primals_8, primals_9, primals_10, primals_11, primals_12, primals_13 = args
        args.clear()
        assert_size_stride(primals_1, (4, 2048, 1600), (3276800, 1600, 1))
        assert_size_stride(primals_2, (1600, ), (1, ))
        assert_size_stride(primals_3, (1600, 1600), (1600, 1))
        assert_size_stride(primals_4, (1600, 1600), (1600, 1))
        assert_size_stride(primals_5, (1600, 1600), (1600, 1))
        assert_size_stride(primals_6, (2048, ), (1, ))
        assert_size_stride(primals_7, (2048, 32), (32, 1))
        assert_size_stride(primals_8, (2048, 32), (32, 1))
        assert_size_stride(primals_9, (1600, 1600), (1600, 1))
        assert_size_stride(primals_10, (1600, ), (1, ))
        assert_size_stride(primals_11, (6400, 1600), (1600, 1))
        assert_size_stride(primals_12, (6400, 1600), (1600, 1))
        assert_size_stride(primals_13, (1600, 6400), (6400, 1))
        with torch.cuda._DeviceGuard(0):
            torch.cuda.set_device(0)
            buf0 = empty_strided_cuda((4, 2048, 1), (2048, 1, 8192), torch.float32)
            buf1 = reinterpret_tensor(buf0, (4, 2048, 1), (2048, 1, 1), 0); del buf0  # reuse
            buf2 = empty_strided_cuda((4, 2048, 1600), (3276800, 1600, 1), torch.bfloat16)
            # Topologically Sorted Source Nodes: [x, pow_1, mean, add, rms_inv, mul, mul_1, to], Original ATen: [aten._to_copy, aten.pow, aten.mean, aten.add, aten.rsqrt, aten.mul]
            stream0 = get_raw_stream(0)
            triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0.run(buf1, primals_1, primals_2, buf2, 8192, 1600, stream=stream0)
            buf3 = empty_strided_cuda((8192, 1600), (1600, 1), torch.bfloat16)
            # Topologically Sorted Source Nodes: [x, mul, mul_1, to, getattr_1, matmul], Original ATen: [aten._to_copy, aten.mul, aten.permute, aten.view, aten.mm]
            extern_kernels.mm(reinterpret_tensor(buf2, (8192, 1600), (1600, 1), 0), reinterpret_tensor(primals_3, (1600, 1600), (1, 1600), 0), out=buf3)
            buf4 = empty_strided_cuda((8192, 1600), (1600, 1), torch.bfloat16)
            # Topologically Sorted Source Nodes: [x, mul, mul_1, to, matmul, getattr_2, matmul_1], Original ATen: [aten._to_copy, aten.mul, aten.view, aten.permute, aten.mm]
            extern_kernels.mm(reinterpret_tensor(buf2, (8192, 1600), (1600, 1), 0), reinterpret_tensor(primals_4, (1600, 1600), (1, 1600), 0), out=buf4)
            buf5 = empty_strided_cuda((8192, 1600), (1600, 1), torch.bfloat16)
            # Topologically Sorted Source Nodes: [x, mul, mul_1, to, matmul, getattr_3, matmul_2], Original ATen: [aten._to_copy, aten.mul, aten.view, aten.permute, aten.mm]
            extern_kernels.mm(reinterpret_tensor(buf2, (8192, 1600), (1600, 1), 0), reinterpret_tensor(primals_5, (1600, 1600), (1, 1600), 0), out=buf5)
            buf6 = empty_strided_cuda((4, 2048, 25, 64), (3276800, 1600, 64, 1), torch.bfloat16)
            buf7 = empty_strided_cuda((4, 2048, 25, 64), (3276800, 1600, 64, 1), torch.bfloat16)
            # Topologically Sorted Source Nodes: [matmul, q, matmul_1, k, pos, cos, sin, getitem_2, x_even, getitem_3, x_odd, mul_2, mul_3, sub, mul_4, mul_5, add_1, rotated, flatten, q_1, getitem_6, x_even_1, getitem_7, x_odd_1, mul_6, mul_7, sub_1, mul_8, mul_9, add_2, rotated_1, flatten_1, k_1], Original ATen: [aten._unsafe_view, aten.view, aten.unsqueeze, aten.index, aten.slice, aten._to_copy, aten.mul, aten.sub, aten.add, aten.stack]
            stream0 = get_raw_stream(0)
            triton_poi_fused__to_copy__unsafe_view_add_index_mul_slice_stack_sub_unsqueeze_view_1.run(buf3, primals_6, primals_7, primals_8, buf4, buf6, buf7, 13107200, stream=stream0)
            # Topologically Sorted Source Nodes: [matmul, q, matmul_1, k, matmul_2, v, pos, cos, sin, getitem_2, x_even, getitem_3, x_odd, mul_2, mul_3, sub, mul_4, mul_5, add_1, rotated, flatten, q_1, getitem_6, x_even_1, getitem_7, x_odd_1, mul_6, mul_7, sub_1, mul_8, mul_9, add_2, rotated_1, flatten_1, k_1, q_2, k_2, v_1, out], Original ATen: [aten._unsafe_view, aten.view, aten.unsqueeze, aten.index, aten.slice, aten._to_copy, aten.mul, aten.sub, aten.add, aten.stack, aten.transpose, aten._scaled_dot_product_cudnn_attention]
            buf8 = torch.ops.aten._scaled_dot_product_cudnn_attention.default(reinterpret_tensor(buf6, (4, 25, 2048, 64), (3276800, 64, 1600, 1), 0), reinterpret_tensor(buf7, (4, 25, 2048, 64), (3276800, 64, 1600, 1), 0), reinterpret_tensor(buf5, (4, 25, 2048, 64), (3276800, 64, 1600, 1), 0), None, True, 0.0, True)
            buf9 = buf8[0]
            assert_size_stride(buf9, (4, 25, 2048, 64), (3276800, 64, 1600, 1), 'torch.ops.aten._scaled_dot_product_cudnn_attention.default')
            assert_alignment(buf9, 16, 'torch.ops.aten._scaled_dot_product_cudnn_attention.default')
            buf10 = buf8[1]
            assert_size_stride(buf10, (4, 25, 2048, 1), (51200, 2048, 1, 1), 'torch.ops.aten._scaled_dot_product_cudnn_attention.default')
            assert_alignment(buf10, 16, 'torch.ops.aten._scaled_dot_product_cudnn_attention.default')
            buf11 = buf8[6]
            assert_size_stride(buf11, (), (), 'torch.ops.aten._scaled_dot_product_cudnn_attention.default')
            assert_alignment(buf11, 16, 'torch.ops.aten._scaled_dot_product_cudnn_attention.default')
            buf12 = buf8[7]
            assert_size_stride(buf12, (), (), 'torch.ops.aten._scaled_dot_product_cudnn_attention.default')
            assert_alignment(buf12, 16, 'torch.ops.aten._scaled_dot_product_cudnn_attention.default')
            del buf8
            buf13 = buf4; del buf4  # reuse
            # Topologically Sorted Source Nodes: [rearrange, getattr_4, matmul_3], Original ATen: [aten.permute, aten.view, aten.mm]
            extern_kernels.mm(reinterpret_tensor(buf9, (8192, 1600), (1600, 1), 0), reinterpret_tensor(primals_9, (1600, 1600), (1, 1600), 0), out=buf13)
            buf14 = empty_strided_cuda((4, 2048, 1), (2048, 1, 8192), torch.float32)
            buf15 = reinterpret_tensor(buf14, (4, 2048, 1), (2048, 1, 1), 0); del buf14  # reuse
            buf16 = reinterpret_tensor(buf3, (4, 2048, 1600), (3276800, 1600, 1), 0); del buf3  # reuse
            # Topologically Sorted Source Nodes: [matmul_3, x_1, x_2, pow_2, mean_1, add_4, rms_inv_1, mul_10, mul_11, to_3], Original ATen: [aten._unsafe_view, aten.add, aten._to_copy, aten.pow, aten.mean, aten.rsqrt, aten.mul]
            stream0 = get_raw_stream(0)
            triton_red_fused__to_copy__unsafe_view_add_mean_mul_pow_rsqrt_2.run(buf15, primals_1, buf13, primals_10, buf16, 8192, 1600, stream=stream0)
            buf17 = empty_strided_cuda((8192, 6400), (6400, 1), torch.bfloat16)
            # Topologically Sorted Source Nodes: [matmul_3, x_1, x_2, mul_10, mul_11, to_3, getattr_5, matmul_4], Original ATen: [aten._unsafe_view, aten.add, aten._to_copy, aten.mul, aten.permute, aten.view, aten.mm]
            extern_kernels.mm(reinterpret_tensor(buf16, (8192, 1600), (1600, 1), 0), reinterpret_tensor(primals_11, (1600, 6400), (1, 1600), 0), out=buf17)
            buf18 = empty_strided_cuda((8192, 6400), (6400, 1), torch.bfloat16)
            # Topologically Sorted Source Nodes: [matmul_3, x_1, x_2, mul_10, mul_11, to_3, matmul_4, getattr_6, matmul_5], Original ATen: [aten._unsafe_view, aten.add, aten._to_copy, aten.mul, aten.view, aten.permute, aten.mm]
            extern_kernels.mm(reinterpret_tensor(buf16, (8192, 1600), (1600, 1), 0), reinterpret_tensor(primals_12, (1600, 6400), (1, 1600), 0), out=buf18)
            buf19 = empty_strided_cuda((4, 2048, 6400), (13107200, 6400, 1), torch.bfloat16)
            # Topologically Sorted Source Nodes: [matmul_4, sigmoid, mul_12, matmul_5, mul_13], Original ATen: [aten._unsafe_view, aten.sigmoid, aten.mul]
            stream0 = get_raw_stream(0)
            triton_poi_fused__unsafe_view_mul_sigmoid_3.run(buf17, buf18, buf19, 52428800, stream=stream0)
            buf20 = empty_strided_cuda((8192, 1600), (1600, 1), torch.bfloat16)
            # Topologically Sorted Source Nodes: [matmul_4, sigmoid, mul_12, matmul_5, mul_13, getattr_7, matmul_6], Original ATen: [aten._unsafe_view, aten.sigmoid, aten.mul, aten.permute, aten.view, aten.mm]
            extern_kernels.mm(reinterpret_tensor(buf19, (8192, 6400), (6400, 1), 0), reinterpret_tensor(primals_13, (6400, 1600), (1, 6400), 0), out=buf20)
            buf21 = reinterpret_tensor(buf20, (4, 2048, 1600), (3276800, 1600, 1), 0); del buf20  # reuse
            # Topologically Sorted Source Nodes: [matmul_3, x_1, matmul_6, add_5], Original ATen: [aten._unsafe_view, aten.add]
            stream0 = get_raw_stream(0)
            triton_poi_fused__unsafe_view_add_4.run(buf21, primals_1, buf13, 13107200, stream=stream0)
        return (buf21, primals_1, primals_2, primals_3, primals_4, primals_5, primals_6, primals_7, primals_8, primals_9, primals_10, primals_11, primals_12, primals_13, buf1, reinterpret_tensor(buf2, (8192, 1600), (1600, 1), 0), reinterpret_tensor(buf6, (4, 25, 2048, 64), (3276800, 64, 1600, 1), 0), reinterpret_tensor(buf7, (4, 25, 2048, 64), (3276800, 64, 1600, 1), 0), reinterpret_tensor(buf5, (4, 25, 2048, 64), (3276800, 64, 1600, 1), 0), buf9, buf10, buf11, buf12, buf13, buf15, reinterpret_tensor(buf16, (8192, 1600), (1600, 1), 0), buf17, buf18, reinterpret_tensor(buf19, (8192, 6400), (6400, 1), 0), )

runner = Runner(partitions=[])
call = runner.call
recursively_apply_fns = runner.recursively_apply_fns


def get_args():
    from torch._dynamo.testing import rand_strided
    primals_1 = rand_strided((4, 2048, 1600), (3276800, 1600, 1), device='cuda:0', dtype=torch.bfloat16)
    primals_2 = rand_strided((1600, ), (1, ), device='cuda:0', dtype=torch.float32)
    primals_3 = rand_strided((1600, 1600), (1600, 1), device='cuda:0', dtype=torch.bfloat16)
    primals_4 = rand_strided((1600, 1600), (1600, 1), device='cuda:0', dtype=torch.bfloat16)
    primals_5 = rand_strided((1600, 1600), (1600, 1), device='cuda:0', dtype=torch.bfloat16)
    primals_6 = rand_strided((2048, ), (1, ), device='cuda:0', dtype=torch.int64)
    primals_7 = rand_strided((2048, 32), (32, 1), device='cuda:0', dtype=torch.float32)
    primals_8 = rand_strided((2048, 32), (32, 1), device='cuda:0', dtype=torch.float32)
    primals_9 = rand_strided((1600, 1600), (1600, 1), device='cuda:0', dtype=torch.bfloat16)
    primals_10 = rand_strided((1600, ), (1, ), device='cuda:0', dtype=torch.float32)
    primals_11 = rand_strided((6400, 1600), (1600, 1), device='cuda:0', dtype=torch.bfloat16)
    primals_12 = rand_strided((6400, 1600), (1600, 1), device='cuda:0', dtype=torch.bfloat16)
    primals_13 = rand_strided((1600, 6400), (6400, 1), device='cuda:0', dtype=torch.bfloat16)
    return [primals_1, primals_2, primals_3, primals_4, primals_5, primals_6, primals_7, primals_8, primals_9, primals_10, primals_11, primals_12, primals_13]


def benchmark_compiled_module(args, times=10, repeat=10):
    from torch._inductor.utils import print_performance
    fn = lambda: call(list(args))
    return print_performance(fn, times=times, repeat=repeat)


if __name__ == "__main__":
    from torch._inductor.wrapper_benchmark import compiled_module_main
    args = get_args()
    compiled_module_main('None', lambda times, repeat: benchmark_compiled_module(args, times=times, repeat=repeat))

Output code written to: /tmp/torchinductor_root/mb/cmbvhhve2ipixp7oehyj35jxzmz4a2uscx432igcevqsxds7ptpx.py
Output code written to: /tmp/torchinductor_root/mb/cmbvhhve2ipixp7oehyj35jxzmz4a2uscx432igcevqsxds7ptpx.py
Output code: 
# AOT ID: ['1_forward']
from ctypes import c_void_p, c_long, c_int
import torch
import math
import random
import os
import tempfile
from math import inf, nan
from cmath import nanj
from torch._inductor.hooks import run_intermediate_hooks
from torch._inductor.utils import maybe_profile
from torch._inductor.codegen.memory_planning import _align as align
from torch import device, empty_strided
from torch._inductor.async_compile import AsyncCompile
from torch._inductor.select_algorithm import extern_kernels
import triton
import triton.language as tl
from torch._inductor.runtime.triton_heuristics import start_graph, end_graph
from torch._C import _cuda_getCurrentRawStream as get_raw_stream

aten = torch.ops.aten
inductor_ops = torch.ops.inductor
_quantized = torch.ops._quantized
assert_size_stride = torch._C._dynamo.guards.assert_size_stride
assert_alignment = torch._C._dynamo.guards.assert_alignment
empty_strided_cpu = torch._C._dynamo.guards._empty_strided_cpu
empty_strided_cpu_pinned = torch._C._dynamo.guards._empty_strided_cpu_pinned
empty_strided_cuda = torch._C._dynamo.guards._empty_strided_cuda
empty_strided_xpu = torch._C._dynamo.guards._empty_strided_xpu
empty_strided_mtia = torch._C._dynamo.guards._empty_strided_mtia
reinterpret_tensor = torch._C._dynamo.guards._reinterpret_tensor
alloc_from_pool = torch.ops.inductor._alloc_from_pool
async_compile = AsyncCompile()
empty_strided_p2p = torch._C._distributed_c10d._SymmetricMemory.empty_strided_p2p


# kernel path: /tmp/torchinductor_root/r2/cr2pqphkniyqhhd73675m6durf3fbnzpjca6wcns5znqxu3bjwp6.py
# Topologically Sorted Source Nodes: [float_1, flatten, cross_entropy], Original ATen: [aten._to_copy, aten.view, prims.prepare_softmax_online, aten._log_softmax]
# Source node to ATen node mapping:
#   cross_entropy => log
#   flatten => view
#   float_1 => convert_element_type
# Graph fragment:
#   %primals_1 : Tensor "bf16[4, 2048, 10000][20480000, 10000, 1]cuda:0" = PlaceHolder[target=primals_1]
#   %getitem_1 : Tensor "f32[8192, 1][1, 8192]cuda:0" = PlaceHolder[target=getitem_1]
#   %convert_element_type : Tensor "f32[4, 2048, 10000][20480000, 10000, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%primals_1, torch.float32), kwargs = {})
#   %view : Tensor "f32[8192, 10000][10000, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.reshape.default](args = (%convert_element_type, [8192, 10000]), kwargs = {})
#   %prepare_softmax_online_default : [num_users=2] = call_function[target=torch.ops.prims.prepare_softmax_online.default](args = (%view, 1), kwargs = {})
#   %log : Tensor "f32[8192, 1][1, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.log.default](args = (%getitem_1,), kwargs = {})
#   return %getitem,%getitem_1,%log
triton_red_fused__log_softmax__to_copy_prepare_softmax_online_view_0 = async_compile.triton('triton_red_fused__log_softmax__to_copy_prepare_softmax_online_view_0', '''
import triton
import triton.language as tl

from torch._inductor.runtime import triton_helpers, triton_heuristics
from torch._inductor.runtime.triton_helpers import libdevice, math as tl_math
from torch._inductor.runtime.hints import AutotuneHint, ReductionHint, TileHint, DeviceProperties
triton_helpers.set_driver_to_gpu()

@triton_heuristics.reduction(
    size_hints={'x': 8192, 'r0_': 16384},
    reduction_hint=ReductionHint.INNER,
    filename=__file__,
    triton_meta={'signature': {'in_out_ptr0': '*fp32', 'in_ptr0': '*bf16', 'out_ptr0': '*fp32', 'xnumel': 'i32', 'r0_numel': 'i32', 'XBLOCK': 'constexpr', 'R0_BLOCK': 'constexpr'}, 'device': DeviceProperties(type='cuda', index=0, multi_processor_count=132, cc=90, major=9, regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048, max_threads_per_block=1024, warp_size=32), 'constants': {}, 'native_matmul': False, 'enable_fp_fusion': True, 'launch_pdl': False, 'disable_ftz': False, 'configs': [{(0,): [['tt.divisibility', 16]], (1,): [['tt.divisibility', 16]], (2,): [['tt.divisibility', 16]], (3,): [['tt.divisibility', 16]], (4,): [['tt.divisibility', 16]]}]},
    inductor_meta={'grid_type': 'Grid1D', 'autotune_hints': set(), 'kernel_name': 'triton_red_fused__log_softmax__to_copy_prepare_softmax_online_view_0', 'mutated_arg_names': ['in_out_ptr0'], 'optimize_mem': False, 'no_x_dim': False, 'atomic_add_found': False, 'num_load': 1, 'num_store': 2, 'num_reduction': 2, 'backend_hash': '91D1D1166449D9E2EB66EB9770C9E2C3B0FEB787341F27FEB4D3F0338DA50336', 'assert_indirect_indexing': True, 'autotune_local_cache': True, 'autotune_pointwise': True, 'autotune_remote_cache': None, 'force_disable_caches': False, 'dynamic_scale_rblock': True, 'max_autotune': False, 'max_autotune_pointwise': False, 'min_split_scan_rblock': 256, 'spill_threshold': 16, 'store_cubin': False, 'deterministic': False, 'force_filter_reduction_configs': False, 'mix_order_reduction_allow_multi_stages': False, 'are_deterministic_algorithms_enabled': False, 'tiling_scores': {'x': 131072, 'r0_': 163840000}}
)
@triton.jit
def triton_red_fused__log_softmax__to_copy_prepare_softmax_online_view_0(in_out_ptr0, in_ptr0, out_ptr0, xnumel, r0_numel, XBLOCK : tl.constexpr, R0_BLOCK : tl.constexpr):
    xnumel = 8192
    r0_numel = 10000
    rnumel = r0_numel
    RBLOCK: tl.constexpr = R0_BLOCK
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:, None]
    xmask = tl.full([XBLOCK], True, tl.int1)[:, None]
    r0_base = tl.arange(0, R0_BLOCK)[None, :]
    rbase = r0_base
    x0 = xindex
    _tmp3_max = tl.full([XBLOCK, R0_BLOCK], float('-inf'), tl.float32)
    _tmp3_sum = tl.zeros([XBLOCK, R0_BLOCK], tl.float32)
    for r0_offset in tl.range(0, r0_numel, R0_BLOCK):
        r0_index = r0_offset + r0_base
        r0_mask = r0_index < r0_numel
        roffset = r0_offset
        rindex = r0_index
        r0_1 = r0_index
        tmp0 = tl.load(in_ptr0 + (r0_1 + 10000*x0), r0_mask, eviction_policy='evict_first', other=0.0).to(tl.float32)
        tmp1 = tmp0.to(tl.float32)
        tmp2 = tl.broadcast_to(tmp1, [XBLOCK, R0_BLOCK])

        _tmp3_max_next, _tmp3_sum_next = triton_helpers.online_softmax_combine(
            _tmp3_max, _tmp3_sum, tmp2, False
        )

        _tmp3_max = tl.where(r0_mask, _tmp3_max_next, _tmp3_max)
        _tmp3_sum = tl.where(r0_mask, _tmp3_sum_next, _tmp3_sum)

    tmp3, tmp4 = triton_helpers.online_softmax_reduce(
        _tmp3_max, _tmp3_sum, 1, False)
    tmp3 = tmp3[:, None]
    tmp4 = tmp4[:, None]
    tl.store(out_ptr0 + (x0), tmp3, None)
    tmp5 = tl_math.log(tmp4)
    tl.debug_barrier()
    tl.store(in_out_ptr0 + (x0), tmp5, None)
''', device_str='cuda')


# kernel path: /tmp/torchinductor_root/7w/c7wulav3uzspcgpch6pd3ndtzbgh25h4q3dzagapfh33vhxdvhe7.py
# Topologically Sorted Source Nodes: [float_1, flatten, flatten_1, cross_entropy], Original ATen: [aten._to_copy, aten.view, aten.sub, aten._log_softmax, aten.nll_loss_forward]
# Source node to ATen node mapping:
#   cross_entropy => convert_element_type_1, div, full_default, full_default_1, gather, ne, neg, squeeze, sub_1, sum_2, sum_3, unsqueeze, where, where_1
#   flatten => view
#   flatten_1 => view_1
#   float_1 => convert_element_type
# Graph fragment:
#   %primals_2 : Tensor "i64[4, 2048][2048, 1]cuda:0" = PlaceHolder[target=primals_2]
#   %primals_1 : Tensor "bf16[4, 2048, 10000][20480000, 10000, 1]cuda:0" = PlaceHolder[target=primals_1]
#   %getitem : Tensor "f32[8192, 1][1, 1]cuda:0" = PlaceHolder[target=getitem]
#   %log : Tensor "f32[8192, 1][1, 1]cuda:0" = PlaceHolder[target=log]
#   %sum_2 : Tensor "i64[][]cuda:0" = PlaceHolder[target=sum_2]
#   %sum_3 : Tensor "f32[][]cuda:0" = PlaceHolder[target=sum_3]
#   %convert_element_type_1 : Tensor "f32[][]cuda:0" = PlaceHolder[target=convert_element_type_1]
#   %convert_element_type : Tensor "f32[4, 2048, 10000][20480000, 10000, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%primals_1, torch.float32), kwargs = {})
#   %view : Tensor "f32[8192, 10000][10000, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.reshape.default](args = (%convert_element_type, [8192, 10000]), kwargs = {})
#   %view_1 : Tensor "i64[8192][1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.reshape.default](args = (%primals_2, [8192]), kwargs = {})
#   %sub_tensor : Tensor "f32[8192, 10000][10000, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.sub.Tensor](args = (%view, %getitem), kwargs = {})
#   %sub_1 : Tensor "f32[8192, 10000][10000, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.sub.Tensor](args = (%sub_tensor, %log), kwargs = {})
#   %ne : Tensor "b8[8192][1]cuda:0"[num_users=3] = call_function[target=torch.ops.aten.ne.Scalar](args = (%view_1, -100), kwargs = {})
#   %full_default : Tensor "i64[][]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.full.default](args = ([], 0), kwargs = {dtype: torch.int64, layout: torch.strided, device: cuda:0, pin_memory: False})
#   %where : Tensor "i64[8192][1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.where.self](args = (%ne, %view_1, %full_default), kwargs = {})
#   %unsqueeze : Tensor "i64[8192, 1][1, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.unsqueeze.default](args = (%where, 1), kwargs = {})
#   %gather : Tensor "f32[8192, 1][1, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.gather.default](args = (%sub_1, 1, %unsqueeze), kwargs = {})
#   %squeeze : Tensor "f32[8192][1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.squeeze.dim](args = (%gather, 1), kwargs = {})
#   %neg : Tensor "f32[8192][1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.neg.default](args = (%squeeze,), kwargs = {})
#   %full_default_1 : Tensor "f32[][]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.full.default](args = ([], 0.0), kwargs = {dtype: torch.float32, layout: torch.strided, device: cuda:0, pin_memory: False})
#   %where_1 : Tensor "f32[8192][1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.where.self](args = (%ne, %neg, %full_default_1), kwargs = {})
#   %sum_2 : Tensor "i64[][]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.sum.default](args = (%ne,), kwargs = {})
#   %convert_element_type_1 : Tensor "f32[][]cuda:0"[num_users=2] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%sum_2, torch.float32), kwargs = {})
#   %sum_3 : Tensor "f32[][]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.sum.default](args = (%where_1,), kwargs = {})
#   %div : Tensor "f32[][]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.div.Tensor](args = (%sum_3, %convert_element_type_1), kwargs = {})
#   return %sum_2,%sum_3,%convert_element_type_1,%div
triton_red_fused__log_softmax__to_copy_nll_loss_forward_sub_view_1 = async_compile.triton('triton_red_fused__log_softmax__to_copy_nll_loss_forward_sub_view_1', '''
import triton
import triton.language as tl

from torch._inductor.runtime import triton_helpers, triton_heuristics
from torch._inductor.runtime.triton_helpers import libdevice, math as tl_math
from torch._inductor.runtime.hints import AutotuneHint, ReductionHint, TileHint, DeviceProperties
triton_helpers.set_driver_to_gpu()

@triton_heuristics.reduction(
    size_hints={'x': 1, 'r0_': 8192},
    reduction_hint=ReductionHint.INNER,
    filename=__file__,
    triton_meta={'signature': {'in_out_ptr0': '*fp32', 'in_ptr0': '*i64', 'in_ptr1': '*bf16', 'in_ptr2': '*fp32', 'in_ptr3': '*fp32', 'out_ptr1': '*fp32', 'xnumel': 'constexpr', 'r0_numel': 'i32', 'XBLOCK': 'constexpr', 'R0_BLOCK': 'constexpr'}, 'device': DeviceProperties(type='cuda', index=0, multi_processor_count=132, cc=90, major=9, regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048, max_threads_per_block=1024, warp_size=32), 'constants': {'xnumel': 1}, 'native_matmul': False, 'enable_fp_fusion': True, 'launch_pdl': False, 'disable_ftz': False, 'configs': [{(0,): [['tt.divisibility', 16]], (1,): [['tt.divisibility', 16]], (2,): [['tt.divisibility', 16]], (3,): [['tt.divisibility', 16]], (4,): [['tt.divisibility', 16]], (5,): [['tt.divisibility', 16]], (7,): [['tt.divisibility', 16]]}]},
    inductor_meta={'grid_type': 'Grid1D', 'autotune_hints': set(), 'kernel_name': 'triton_red_fused__log_softmax__to_copy_nll_loss_forward_sub_view_1', 'mutated_arg_names': ['in_out_ptr0'], 'optimize_mem': False, 'no_x_dim': False, 'atomic_add_found': False, 'num_load': 3, 'num_store': 2, 'num_reduction': 2, 'backend_hash': '91D1D1166449D9E2EB66EB9770C9E2C3B0FEB787341F27FEB4D3F0338DA50336', 'assert_indirect_indexing': True, 'autotune_local_cache': True, 'autotune_pointwise': True, 'autotune_remote_cache': None, 'force_disable_caches': False, 'dynamic_scale_rblock': True, 'max_autotune': False, 'max_autotune_pointwise': False, 'min_split_scan_rblock': 256, 'spill_threshold': 16, 'store_cubin': False, 'deterministic': False, 'force_filter_reduction_configs': False, 'mix_order_reduction_allow_multi_stages': False, 'are_deterministic_algorithms_enabled': False, 'tiling_scores': {'r0_': 131072}}
)
@triton.jit
def triton_red_fused__log_softmax__to_copy_nll_loss_forward_sub_view_1(in_out_ptr0, in_ptr0, in_ptr1, in_ptr2, in_ptr3, out_ptr1, xnumel, r0_numel, XBLOCK : tl.constexpr, R0_BLOCK : tl.constexpr):
    xnumel = 1
    r0_numel = 8192
    rnumel = r0_numel
    RBLOCK: tl.constexpr = R0_BLOCK
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:, None]
    xmask = tl.full([XBLOCK], True, tl.int1)[:, None]
    r0_base = tl.arange(0, R0_BLOCK)[None, :]
    rbase = r0_base
    _tmp5 = tl.full([XBLOCK, R0_BLOCK], 0, tl.int64)
    _tmp24 = tl.full([XBLOCK, R0_BLOCK], 0, tl.float32)
    for r0_offset in tl.range(0, r0_numel, R0_BLOCK):
        r0_index = r0_offset + r0_base
        r0_mask = r0_index < r0_numel
        roffset = r0_offset
        rindex = r0_index
        r0_0 = r0_index
        tmp0 = tl.load(in_ptr0 + (r0_0), r0_mask, eviction_policy='evict_first', other=0.0)
        tmp16 = tl.load(in_ptr2 + (r0_0), r0_mask, eviction_policy='evict_first', other=0.0)
        tmp18 = tl.load(in_ptr3 + (r0_0), r0_mask, eviction_policy='evict_first', other=0.0)
        tmp1 = tl.full([1, 1], -100, tl.int64)
        tmp2 = tmp0 != tmp1
        tmp3 = tmp2.to(tl.int64)
        tmp4 = tl.broadcast_to(tmp3, [XBLOCK, R0_BLOCK])
        tmp6 = _tmp5 + tmp4
        _tmp5 = tl.where(r0_mask, tmp6, _tmp5)
        tmp7 = tl.full([1, 1], 0, tl.int64)
        tmp8 = tl.where(tmp2, tmp0, tmp7)
        tmp9 = tl.full([1, 1], 10000, tl.int32)
        tmp10 = tmp8 + tmp9
        tmp11 = tmp8 < 0
        tmp12 = tl.where(tmp11, tmp10, tmp8)
        tl.device_assert(((0 <= tmp12) & (tmp12 < 10000)) | ~(r0_mask), "index out of bounds: 0 <= tmp12 < 10000")
        tmp14 = tl.load(in_ptr1 + (tmp12 + 10000*r0_0), r0_mask, eviction_policy='evict_last', other=0.0).to(tl.float32)
        tmp15 = tmp14.to(tl.float32)
        tmp17 = tmp15 - tmp16
        tmp19 = tmp17 - tmp18
        tmp20 = -tmp19
        tmp21 = tl.full([1, 1], 0.0, tl.float32)
        tmp22 = tl.where(tmp2, tmp20, tmp21)
        tmp23 = tl.broadcast_to(tmp22, [XBLOCK, R0_BLOCK])
        tmp25 = _tmp24 + tmp23
        _tmp24 = tl.where(r0_mask, tmp25, _tmp24)
    tmp5 = tl.sum(_tmp5, 1)[:, None]
    tmp24 = tl.sum(_tmp24, 1)[:, None]
    tmp26 = tmp5.to(tl.float32)
    tmp27 = (tmp24 / tmp26)
    tl.store(out_ptr1 + (tl.full([1, 1], 0, tl.int32).broadcast_to(XBLOCK, 1)), tmp26, None)
    tl.debug_barrier()
    tl.store(in_out_ptr0 + (tl.full([1, 1], 0, tl.int32).broadcast_to(XBLOCK, 1)), tmp27, None)
''', device_str='cuda')


async_compile.wait(globals())
del async_compile

class Runner:
    def __init__(self, partitions):
        self.partitions = partitions

    def recursively_apply_fns(self, fns):
        new_callables = []
        for fn, c in zip(fns, self.partitions):
            new_callables.append(fn(c))
        self.partitions = new_callables

    def call(self, args):
        primals_1, primals_2 = args
        args.clear()
        assert_size_stride(primals_1, (4, 2048, 10000), (20480000, 10000, 1))
        assert_size_stride(primals_2, (4, 2048), (2048, 1))
        with torch.cuda._DeviceGuard(0):
            torch.cuda.set_device(0)
            buf0 = empty_strided_cuda((8192, 1), (1, 1), torch.float32)
            buf1 = empty_strided_cuda((8192, 1), (1, 8192), torch.float32)
            buf2 = reinterpret_tensor(buf1, (8192, 1), (1, 1), 0); del buf1  # reuse
            # Topologically Sorted Source Nodes: [float_1, flatten, cross_entropy], Original ATen: [aten._to_copy, aten.view, prims.prepare_softmax_online, aten._log_softmax]
            stream0 = get_raw_stream(0)
            triton_red_fused__log_softmax__to_copy_prepare_softmax_online_view_0.run(buf2, primals_1, buf0, 8192, 10000, stream=stream0)
            buf5 = empty_strided_cuda((), (), torch.float32)
            buf4 = empty_strided_cuda((), (), torch.float32)
            buf6 = buf5; del buf5  # reuse
            # Topologically Sorted Source Nodes: [float_1, flatten, flatten_1, cross_entropy], Original ATen: [aten._to_copy, aten.view, aten.sub, aten._log_softmax, aten.nll_loss_forward]
            stream0 = get_raw_stream(0)
            triton_red_fused__log_softmax__to_copy_nll_loss_forward_sub_view_1.run(buf6, primals_2, primals_1, buf0, buf2, buf4, 1, 8192, stream=stream0)
        return (buf6, primals_1, primals_2, buf0, buf2, buf4, )

runner = Runner(partitions=[])
call = runner.call
recursively_apply_fns = runner.recursively_apply_fns


def get_args():
    from torch._dynamo.testing import rand_strided
    primals_1 = rand_strided((4, 2048, 10000), (20480000, 10000, 1), device='cuda:0', dtype=torch.bfloat16)
    primals_2 = rand_strided((4, 2048), (2048, 1), device='cuda:0', dtype=torch.int64)
    return [primals_1, primals_2]


def benchmark_compiled_module(args, times=10, repeat=10):
    from torch._inductor.utils import print_performance
    fn = lambda: call(list(args))
    return print_performance(fn, times=times, repeat=repeat)


if __name__ == "__main__":
    from torch._inductor.wrapper_benchmark import compiled_module_main
    args = get_args()
    compiled_module_main('None', lambda times, repeat: benchmark_compiled_module(args, times=times, repeat=repeat))

Output code written to: /tmp/torchinductor_root/64/c64nnpzhcuwpts63gso4fqvrlzy4pvhuxh7yg3wvt4ymlmv7q6k3.py
Output code written to: /tmp/torchinductor_root/64/c64nnpzhcuwpts63gso4fqvrlzy4pvhuxh7yg3wvt4ymlmv7q6k3.py
Output code: 
# AOT ID: ['1_backward']
from ctypes import c_void_p, c_long, c_int
import torch
import math
import random
import os
import tempfile
from math import inf, nan
from cmath import nanj
from torch._inductor.hooks import run_intermediate_hooks
from torch._inductor.utils import maybe_profile
from torch._inductor.codegen.memory_planning import _align as align
from torch import device, empty_strided
from torch._inductor.async_compile import AsyncCompile
from torch._inductor.select_algorithm import extern_kernels
import triton
import triton.language as tl
from torch._inductor.runtime.triton_heuristics import start_graph, end_graph
from torch._C import _cuda_getCurrentRawStream as get_raw_stream

aten = torch.ops.aten
inductor_ops = torch.ops.inductor
_quantized = torch.ops._quantized
assert_size_stride = torch._C._dynamo.guards.assert_size_stride
assert_alignment = torch._C._dynamo.guards.assert_alignment
empty_strided_cpu = torch._C._dynamo.guards._empty_strided_cpu
empty_strided_cpu_pinned = torch._C._dynamo.guards._empty_strided_cpu_pinned
empty_strided_cuda = torch._C._dynamo.guards._empty_strided_cuda
empty_strided_xpu = torch._C._dynamo.guards._empty_strided_xpu
empty_strided_mtia = torch._C._dynamo.guards._empty_strided_mtia
reinterpret_tensor = torch._C._dynamo.guards._reinterpret_tensor
alloc_from_pool = torch.ops.inductor._alloc_from_pool
async_compile = AsyncCompile()
empty_strided_p2p = torch._C._distributed_c10d._SymmetricMemory.empty_strided_p2p


# kernel path: /tmp/torchinductor_root/2c/c2cqktx2ajs2dcw2njr2dw3q5wctrrthiu5aap2rieutriy6iuct.py
# Topologically Sorted Source Nodes: [div_1, flatten_1, unsqueeze_1, ne_3, cross_entropy, where_2, where_3, mul, float_1, flatten, exp_1, sum_4, mul_1, sub_2, view_2, convert_element_type_2], Original ATen: [aten.nll_loss_backward, aten.view, aten.nll_loss_forward, aten.arange, aten.expand, aten.eq, aten.scalar_tensor, aten.where, aten._to_copy, aten._log_softmax, aten._log_softmax_backward_data]
# Source node to ATen node mapping:
#   convert_element_type_2 => convert_element_type_2
#   cross_entropy => full_default, full_default_1, sub, sub_1
#   div_1 => div_1
#   exp_1 => exp_1
#   flatten => view
#   flatten_1 => view_1
#   float_1 => convert_element_type
#   mul => mul
#   mul_1 => mul_1
#   ne_3 => ne_3
#   sub_2 => sub_2
#   sum_4 => sum_4
#   unsqueeze_1 => unsqueeze_1
#   view_2 => view_2
#   where_2 => where_2
#   where_3 => where_3
# Graph fragment:
#   %primals_2 : Tensor "i64[4, 2048][2048, 1]cuda:0" = PlaceHolder[target=primals_2]
#   %tangents_1 : Tensor "f32[][]cuda:0" = PlaceHolder[target=tangents_1]
#   %convert_element_type_1 : Tensor "f32[][]cuda:0" = PlaceHolder[target=convert_element_type_1]
#   %primals_1 : Tensor "bf16[4, 2048, 10000][20480000, 10000, 1]cuda:0" = PlaceHolder[target=primals_1]
#   %amax : Tensor "f32[8192, 1][1, 1]cuda:0" = PlaceHolder[target=amax]
#   %log : Tensor "f32[8192, 1][1, 1]cuda:0" = PlaceHolder[target=log]
#   %sum_4 : Tensor "f32[8192, 1][1, 8192]cuda:0" = PlaceHolder[target=sum_4]
#   %div_1 : Tensor "f32[][]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.div.Tensor](args = (%tangents_1, %convert_element_type_1), kwargs = {})
#   %view_1 : Tensor "i64[8192][1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.reshape.default](args = (%primals_2, [8192]), kwargs = {})
#   %unsqueeze_1 : Tensor "i64[8192, 1][1, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.unsqueeze.default](args = (%view_1, 1), kwargs = {})
#   %ne_3 : Tensor "b8[8192, 1][1, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.ne.Scalar](args = (%unsqueeze_1, -100), kwargs = {})
#   %full_default : Tensor "i64[][]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.full.default](args = ([], 0), kwargs = {dtype: torch.int64, layout: torch.strided, device: cuda:0, pin_memory: False})
#   %where_2 : Tensor "i64[8192, 1][1, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.where.self](args = (%ne_3, %unsqueeze_1, %full_default), kwargs = {})
#   %iota_default : Tensor "i64[10000][1]cuda:0"[num_users=1] = call_function[target=torch.ops.prims.iota.default](args = (10000,), kwargs = {start: 0, step: 1, dtype: torch.int64, device: cuda:0, requires_grad: False})
#   %view_default : Tensor "i64[1, 10000][10000, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.reshape.default](args = (%iota_default, [1, 10000]), kwargs = {})
#   %expand_default : Tensor "i64[8192, 10000][1, 0]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.expand.default](args = (%where_2, [8192, 10000]), kwargs = {})
#   %eq_tensor : Tensor "b8[8192, 10000][10000, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.eq.Tensor](args = (%expand_default, %view_default), kwargs = {})
#   %scalar_tensor_default : Tensor "f32[][]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.scalar_tensor.default](args = (0,), kwargs = {dtype: torch.float32, layout: torch.strided, device: cuda:0})
#   %scalar_tensor_default_1 : Tensor "f32[][]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.scalar_tensor.default](args = (-1.0,), kwargs = {dtype: torch.float32, layout: torch.strided, device: cuda:0})
#   %where_self : Tensor "f32[8192, 10000][10000, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.where.self](args = (%eq_tensor, %scalar_tensor_default_1, %scalar_tensor_default), kwargs = {})
#   %full_default_1 : Tensor "f32[][]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.full.default](args = ([], 0.0), kwargs = {dtype: torch.float32, layout: torch.strided, device: cuda:0, pin_memory: False})
#   %where_3 : Tensor "f32[8192, 1][1, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.where.self](args = (%ne_3, %div_1, %full_default_1), kwargs = {})
#   %mul : Tensor "f32[8192, 10000][10000, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.mul.Tensor](args = (%where_self, %where_3), kwargs = {})
#   %convert_element_type : Tensor "f32[4, 2048, 10000][20480000, 10000, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%primals_1, torch.float32), kwargs = {})
#   %view : Tensor "f32[8192, 10000][10000, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.reshape.default](args = (%convert_element_type, [8192, 10000]), kwargs = {})
#   %sub : Tensor "f32[8192, 10000][10000, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.sub.Tensor](args = (%view, %amax), kwargs = {})
#   %sub_1 : Tensor "f32[8192, 10000][10000, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.sub.Tensor](args = (%sub, %log), kwargs = {})
#   %exp_1 : Tensor "f32[8192, 10000][10000, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.exp.default](args = (%sub_1,), kwargs = {})
#   %sum_4 : Tensor "f32[8192, 1][1, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.sum.dim_IntList](args = (%mul, [1], True), kwargs = {})
#   %mul_1 : Tensor "f32[8192, 10000][10000, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%exp_1, %sum_4), kwargs = {})
#   %sub_2 : Tensor "f32[8192, 10000][10000, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.sub.Tensor](args = (%mul, %mul_1), kwargs = {})
#   %view_2 : Tensor "f32[4, 2048, 10000][20480000, 10000, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.reshape.default](args = (%sub_2, [4, 2048, 10000]), kwargs = {})
#   %convert_element_type_2 : Tensor "bf16[4, 2048, 10000][20480000, 10000, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%view_2, torch.bfloat16), kwargs = {})
#   return %sum_4,%convert_element_type_2
triton_red_fused__log_softmax__log_softmax_backward_data__to_copy_arange_eq_expand_nll_loss_backward_nll_loss_forward_scalar_tensor_view_where_0 = async_compile.triton('triton_red_fused__log_softmax__log_softmax_backward_data__to_copy_arange_eq_expand_nll_loss_backward_nll_loss_forward_scalar_tensor_view_where_0', '''
import triton
import triton.language as tl

from torch._inductor.runtime import triton_helpers, triton_heuristics
from torch._inductor.runtime.triton_helpers import libdevice, math as tl_math
from torch._inductor.runtime.hints import AutotuneHint, ReductionHint, TileHint, DeviceProperties
triton_helpers.set_driver_to_gpu()

@triton_heuristics.reduction(
    size_hints={'x': 8192, 'r0_': 16384},
    reduction_hint=ReductionHint.INNER,
    filename=__file__,
    triton_meta={'signature': {'in_ptr0': '*i64', 'in_ptr1': '*fp32', 'in_ptr2': '*fp32', 'in_ptr3': '*bf16', 'in_ptr4': '*fp32', 'in_ptr5': '*fp32', 'out_ptr1': '*bf16', 'xnumel': 'i32', 'r0_numel': 'i32', 'XBLOCK': 'constexpr', 'R0_BLOCK': 'constexpr'}, 'device': DeviceProperties(type='cuda', index=0, multi_processor_count=132, cc=90, major=9, regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048, max_threads_per_block=1024, warp_size=32), 'constants': {}, 'native_matmul': False, 'enable_fp_fusion': True, 'launch_pdl': False, 'disable_ftz': False, 'configs': [{(0,): [['tt.divisibility', 16]], (1,): [['tt.divisibility', 16]], (2,): [['tt.divisibility', 16]], (3,): [['tt.divisibility', 16]], (4,): [['tt.divisibility', 16]], (5,): [['tt.divisibility', 16]], (6,): [['tt.divisibility', 16]], (7,): [['tt.divisibility', 16]], (8,): [['tt.divisibility', 16]]}]},
    inductor_meta={'grid_type': 'Grid1D', 'autotune_hints': set(), 'kernel_name': 'triton_red_fused__log_softmax__log_softmax_backward_data__to_copy_arange_eq_expand_nll_loss_backward_nll_loss_forward_scalar_tensor_view_where_0', 'mutated_arg_names': [], 'optimize_mem': True, 'no_x_dim': False, 'atomic_add_found': False, 'num_load': 8, 'num_store': 1, 'num_reduction': 1, 'backend_hash': '91D1D1166449D9E2EB66EB9770C9E2C3B0FEB787341F27FEB4D3F0338DA50336', 'assert_indirect_indexing': True, 'autotune_local_cache': True, 'autotune_pointwise': True, 'autotune_remote_cache': None, 'force_disable_caches': False, 'dynamic_scale_rblock': True, 'max_autotune': False, 'max_autotune_pointwise': False, 'min_split_scan_rblock': 256, 'spill_threshold': 16, 'store_cubin': False, 'deterministic': False, 'force_filter_reduction_configs': False, 'mix_order_reduction_allow_multi_stages': False, 'are_deterministic_algorithms_enabled': False, 'tiling_scores': {'x': 131072, 'r0_': 491520000}}
)
@triton.jit
def triton_red_fused__log_softmax__log_softmax_backward_data__to_copy_arange_eq_expand_nll_loss_backward_nll_loss_forward_scalar_tensor_view_where_0(in_ptr0, in_ptr1, in_ptr2, in_ptr3, in_ptr4, in_ptr5, out_ptr1, xnumel, r0_numel, XBLOCK : tl.constexpr, R0_BLOCK : tl.constexpr):
    xnumel = 8192
    r0_numel = 10000
    rnumel = r0_numel
    RBLOCK: tl.constexpr = R0_BLOCK
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:, None]
    xmask = tl.full([XBLOCK], True, tl.int1)[:, None]
    r0_base = tl.arange(0, R0_BLOCK)[None, :]
    rbase = r0_base
    x0 = xindex
    tmp0 = tl.load(in_ptr0 + (x0), None, eviction_policy='evict_last')
    tmp10 = tl.load(in_ptr1 + (0))
    tmp11 = tl.broadcast_to(tmp10, [1, 1])
    tmp12 = tl.load(in_ptr2 + (0))
    tmp13 = tl.broadcast_to(tmp12, [1, 1])
    _tmp18 = tl.full([XBLOCK, R0_BLOCK], 0, tl.float32)
    for r0_offset in tl.range(0, r0_numel, R0_BLOCK):
        r0_index = r0_offset + r0_base
        r0_mask = r0_index < r0_numel
        roffset = r0_offset
        rindex = r0_index
        r0_1 = r0_index
        tmp1 = tl.full([1, 1], -100, tl.int64)
        tmp2 = tmp0 != tmp1
        tmp3 = tl.full([1, 1], 0, tl.int64)
        tmp4 = tl.where(tmp2, tmp0, tmp3)
        tmp5 = r0_1
        tmp6 = tmp4 == tmp5
        tmp7 = tl.full([1, 1], -1.0, tl.float32)
        tmp8 = tl.full([1, 1], 0.0, tl.float32)
        tmp9 = tl.where(tmp6, tmp7, tmp8)
        tmp14 = (tmp11 / tmp13)
        tmp15 = tl.where(tmp2, tmp14, tmp8)
        tmp16 = tmp9 * tmp15
        tmp17 = tl.broadcast_to(tmp16, [XBLOCK, R0_BLOCK])
        tmp19 = _tmp18 + tmp17
        _tmp18 = tl.where(r0_mask, tmp19, _tmp18)
    tmp18 = tl.sum(_tmp18, 1)[:, None]
    tmp29 = tl.load(in_ptr1 + (0))
    tmp30 = tl.broadcast_to(tmp29, [1, 1])
    tmp31 = tl.load(in_ptr2 + (0))
    tmp32 = tl.broadcast_to(tmp31, [1, 1])
    tmp38 = tl.load(in_ptr4 + (x0), None, eviction_policy='evict_last')
    tmp40 = tl.load(in_ptr5 + (x0), None, eviction_policy='evict_last')
    for r0_offset in tl.range(0, r0_numel, R0_BLOCK):
        r0_index = r0_offset + r0_base
        r0_mask = r0_index < r0_numel
        roffset = r0_offset
        rindex = r0_index
        r0_1 = r0_index
        tmp36 = tl.load(in_ptr3 + (r0_1 + 10000*x0), r0_mask, eviction_policy='evict_first', other=0.0).to(tl.float32)
        tmp20 = tl.full([1, 1], -100, tl.int64)
        tmp21 = tmp0 != tmp20
        tmp22 = tl.full([1, 1], 0, tl.int64)
        tmp23 = tl.where(tmp21, tmp0, tmp22)
        tmp24 = r0_1
        tmp25 = tmp23 == tmp24
        tmp26 = tl.full([1, 1], -1.0, tl.float32)
        tmp27 = tl.full([1, 1], 0.0, tl.float32)
        tmp28 = tl.where(tmp25, tmp26, tmp27)
        tmp33 = (tmp30 / tmp32)
        tmp34 = tl.where(tmp21, tmp33, tmp27)
        tmp35 = tmp28 * tmp34
        tmp37 = tmp36.to(tl.float32)
        tmp39 = tmp37 - tmp38
        tmp41 = tmp39 - tmp40
        tmp42 = libdevice.exp(tmp41)
        tmp43 = tmp42 * tmp18
        tmp44 = tmp35 - tmp43
        tmp45 = tmp44.to(tl.float32)
        tl.store(out_ptr1 + (r0_1 + 10000*x0), tmp45, r0_mask)
''', device_str='cuda')


async_compile.wait(globals())
del async_compile

class Runner:
    def __init__(self, partitions):
        self.partitions = partitions

    def recursively_apply_fns(self, fns):
        new_callables = []
        for fn, c in zip(fns, self.partitions):
            new_callables.append(fn(c))
        self.partitions = new_callables

    def call(self, args):
        primals_1, primals_2, amax, log, convert_element_type_1, tangents_1 = args
        args.clear()
        assert_size_stride(primals_1, (4, 2048, 10000), (20480000, 10000, 1))
        assert_size_stride(primals_2, (4, 2048), (2048, 1))
        assert_size_stride(amax, (8192, 1), (1, 1))
        assert_size_stride(log, (8192, 1), (1, 1))
        assert_size_stride(convert_element_type_1, (), ())
        assert_size_stride(tangents_1, (), ())
        with torch.cuda._DeviceGuard(0):
            torch.cuda.set_device(0)
            buf1 = empty_strided_cuda((4, 2048, 10000), (20480000, 10000, 1), torch.bfloat16)
            # Topologically Sorted Source Nodes: [div_1, flatten_1, unsqueeze_1, ne_3, cross_entropy, where_2, where_3, mul, float_1, flatten, exp_1, sum_4, mul_1, sub_2, view_2, convert_element_type_2], Original ATen: [aten.nll_loss_backward, aten.view, aten.nll_loss_forward, aten.arange, aten.expand, aten.eq, aten.scalar_tensor, aten.where, aten._to_copy, aten._log_softmax, aten._log_softmax_backward_data]
            stream0 = get_raw_stream(0)
            triton_red_fused__log_softmax__log_softmax_backward_data__to_copy_arange_eq_expand_nll_loss_backward_nll_loss_forward_scalar_tensor_view_where_0.run(primals_2, tangents_1, convert_element_type_1, primals_1, amax, log, buf1, 8192, 10000, stream=stream0)
            del amax
            del convert_element_type_1
            del log
            del primals_1
            del primals_2
            del tangents_1
        return (buf1, None, )

runner = Runner(partitions=[])
call = runner.call
recursively_apply_fns = runner.recursively_apply_fns


def get_args():
    from torch._dynamo.testing import rand_strided
    primals_1 = rand_strided((4, 2048, 10000), (20480000, 10000, 1), device='cuda:0', dtype=torch.bfloat16)
    primals_2 = rand_strided((4, 2048), (2048, 1), device='cuda:0', dtype=torch.int64)
    amax = rand_strided((8192, 1), (1, 1), device='cuda:0', dtype=torch.float32)
    log = rand_strided((8192, 1), (1, 1), device='cuda:0', dtype=torch.float32)
    convert_element_type_1 = rand_strided((), (), device='cuda:0', dtype=torch.float32)
    tangents_1 = rand_strided((), (), device='cuda:0', dtype=torch.float32)
    return [primals_1, primals_2, amax, log, convert_element_type_1, tangents_1]


def benchmark_compiled_module(args, times=10, repeat=10):
    from torch._inductor.utils import print_performance
    fn = lambda: call(list(args))
    return print_performance(fn, times=times, repeat=repeat)


if __name__ == "__main__":
    from torch._inductor.wrapper_benchmark import compiled_module_main
    args = get_args()
    compiled_module_main('None', lambda times, repeat: benchmark_compiled_module(args, times=times, repeat=repeat))

Output code written to: /tmp/torchinductor_root/o7/co7d7op3jfknghecj75zugwowvov6sqmcrr4cldrjk5eas6pwsiy.py
Output code written to: /tmp/torchinductor_root/o7/co7d7op3jfknghecj75zugwowvov6sqmcrr4cldrjk5eas6pwsiy.py
Output code: 
# AOT ID: ['0_backward']
from ctypes import c_void_p, c_long, c_int
import torch
import math
import random
import os
import tempfile
from math import inf, nan
from cmath import nanj
from torch._inductor.hooks import run_intermediate_hooks
from torch._inductor.utils import maybe_profile
from torch._inductor.codegen.memory_planning import _align as align
from torch import device, empty_strided
from torch._inductor.async_compile import AsyncCompile
from torch._inductor.select_algorithm import extern_kernels
import triton
import triton.language as tl
from torch._inductor.runtime.triton_heuristics import start_graph, end_graph
from torch._C import _cuda_getCurrentRawStream as get_raw_stream

aten = torch.ops.aten
inductor_ops = torch.ops.inductor
_quantized = torch.ops._quantized
assert_size_stride = torch._C._dynamo.guards.assert_size_stride
assert_alignment = torch._C._dynamo.guards.assert_alignment
empty_strided_cpu = torch._C._dynamo.guards._empty_strided_cpu
empty_strided_cpu_pinned = torch._C._dynamo.guards._empty_strided_cpu_pinned
empty_strided_cuda = torch._C._dynamo.guards._empty_strided_cuda
empty_strided_xpu = torch._C._dynamo.guards._empty_strided_xpu
empty_strided_mtia = torch._C._dynamo.guards._empty_strided_mtia
reinterpret_tensor = torch._C._dynamo.guards._reinterpret_tensor
alloc_from_pool = torch.ops.inductor._alloc_from_pool
async_compile = AsyncCompile()
empty_strided_p2p = torch._C._distributed_c10d._SymmetricMemory.empty_strided_p2p


# kernel path: /tmp/torchinductor_root/zr/czr5xx265dijk26pvgu47ss3rw7nwsn6frqdskrl76yvakok4dnc.py
# Topologically Sorted Source Nodes: [view_21, matmul_4, sigmoid, mul_12, mul_14, matmul_5, mul_15, mul_16, mul_17, convert_element_type_32, convert_element_type_33, sub_2, mul_18, mul_19, convert_element_type_34, add_6], Original ATen: [aten.view, aten._unsafe_view, aten.sigmoid, aten.mul, aten.sigmoid_backward, aten.add]
# Source node to ATen node mapping:
#   add_6 => add_6
#   convert_element_type_32 => convert_element_type_32
#   convert_element_type_33 => convert_element_type_33
#   convert_element_type_34 => convert_element_type_34
#   matmul_4 => view_15
#   matmul_5 => view_17
#   mul_12 => mul_12
#   mul_14 => mul_14
#   mul_15 => mul_15
#   mul_16 => mul_16
#   mul_17 => mul_17
#   mul_18 => mul_18
#   mul_19 => mul_19
#   sigmoid => sigmoid
#   sub_2 => sub_2
#   view_21 => view_21
# Graph fragment:
#   %mm_8 : Tensor "bf16[8192, 6400][6400, 1]cuda:0" = PlaceHolder[target=mm_8]
#   %mm_4 : Tensor "bf16[8192, 6400][6400, 1]cuda:0" = PlaceHolder[target=mm_4]
#   %mm_5 : Tensor "bf16[8192, 6400][6400, 1]cuda:0" = PlaceHolder[target=mm_5]
#   %view_21 : Tensor "bf16[4, 2048, 6400][13107200, 6400, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.reshape.default](args = (%mm_8, [4, 2048, 6400]), kwargs = {})
#   %view_15 : Tensor "bf16[4, 2048, 6400][13107200, 6400, 1]cuda:0"[num_users=3] = call_function[target=torch.ops.aten.reshape.default](args = (%mm_4, [4, 2048, 6400]), kwargs = {})
#   %sigmoid : Tensor "bf16[4, 2048, 6400][13107200, 6400, 1]cuda:0"[num_users=3] = call_function[target=torch.ops.aten.sigmoid.default](args = (%view_15,), kwargs = {})
#   %mul_12 : Tensor "bf16[4, 2048, 6400][13107200, 6400, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%view_15, %sigmoid), kwargs = {})
#   %mul_14 : Tensor "bf16[4, 2048, 6400][13107200, 6400, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%view_21, %mul_12), kwargs = {})
#   %view_17 : Tensor "bf16[4, 2048, 6400][13107200, 6400, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.reshape.default](args = (%mm_5, [4, 2048, 6400]), kwargs = {})
#   %mul_15 : Tensor "bf16[4, 2048, 6400][13107200, 6400, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.mul.Tensor](args = (%view_21, %view_17), kwargs = {})
#   %mul_16 : Tensor "bf16[4, 2048, 6400][13107200, 6400, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%mul_15, %view_15), kwargs = {})
#   %mul_17 : Tensor "bf16[4, 2048, 6400][13107200, 6400, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%mul_15, %sigmoid), kwargs = {})
#   %convert_element_type_32 : Tensor "f32[4, 2048, 6400][13107200, 6400, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%mul_16, torch.float32), kwargs = {})
#   %convert_element_type_33 : Tensor "f32[4, 2048, 6400][13107200, 6400, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%sigmoid, torch.float32), kwargs = {})
#   %sub_2 : Tensor "f32[4, 2048, 6400][13107200, 6400, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.sub.Tensor](args = (1, %convert_element_type_33), kwargs = {})
#   %mul_18 : Tensor "f32[4, 2048, 6400][13107200, 6400, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%convert_element_type_33, %sub_2), kwargs = {})
#   %mul_19 : Tensor "f32[4, 2048, 6400][13107200, 6400, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%convert_element_type_32, %mul_18), kwargs = {})
#   %convert_element_type_34 : Tensor "bf16[4, 2048, 6400][13107200, 6400, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%mul_19, torch.bfloat16), kwargs = {})
#   %add_6 : Tensor "bf16[4, 2048, 6400][13107200, 6400, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.add.Tensor](args = (%mul_17, %convert_element_type_34), kwargs = {})
#   return %mul_14,%add_6
triton_poi_fused__unsafe_view_add_mul_sigmoid_sigmoid_backward_view_0 = async_compile.triton('triton_poi_fused__unsafe_view_add_mul_sigmoid_sigmoid_backward_view_0', '''
import triton
import triton.language as tl

from torch._inductor.runtime import triton_helpers, triton_heuristics
from torch._inductor.runtime.triton_helpers import libdevice, math as tl_math
from torch._inductor.runtime.hints import AutotuneHint, ReductionHint, TileHint, DeviceProperties
triton_helpers.set_driver_to_gpu()

@triton_heuristics.pointwise(
    size_hints={'x': 67108864}, 
    filename=__file__,
    triton_meta={'signature': {'in_out_ptr0': '*bf16', 'in_ptr0': '*bf16', 'in_ptr1': '*bf16', 'out_ptr0': '*bf16', 'xnumel': 'i32', 'XBLOCK': 'constexpr'}, 'device': DeviceProperties(type='cuda', index=0, multi_processor_count=132, cc=90, major=9, regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048, max_threads_per_block=1024, warp_size=32), 'constants': {}, 'native_matmul': False, 'enable_fp_fusion': True, 'launch_pdl': False, 'disable_ftz': False, 'configs': [{(0,): [['tt.divisibility', 16]], (1,): [['tt.divisibility', 16]], (2,): [['tt.divisibility', 16]], (3,): [['tt.divisibility', 16]], (4,): [['tt.divisibility', 16]]}]},
    inductor_meta={'grid_type': 'Grid1D', 'autotune_hints': set(), 'kernel_name': 'triton_poi_fused__unsafe_view_add_mul_sigmoid_sigmoid_backward_view_0', 'mutated_arg_names': ['in_out_ptr0'], 'optimize_mem': True, 'no_x_dim': False, 'atomic_add_found': False, 'num_load': 3, 'num_store': 2, 'num_reduction': 0, 'backend_hash': '91D1D1166449D9E2EB66EB9770C9E2C3B0FEB787341F27FEB4D3F0338DA50336', 'assert_indirect_indexing': True, 'autotune_local_cache': True, 'autotune_pointwise': True, 'autotune_remote_cache': None, 'force_disable_caches': False, 'dynamic_scale_rblock': True, 'max_autotune': False, 'max_autotune_pointwise': False, 'min_split_scan_rblock': 256, 'spill_threshold': 16, 'store_cubin': False, 'deterministic': False, 'force_filter_reduction_configs': False, 'mix_order_reduction_allow_multi_stages': False, 'are_deterministic_algorithms_enabled': False, 'tiling_scores': {'x': 734003200}},
    min_elem_per_thread=0
)
@triton.jit
def triton_poi_fused__unsafe_view_add_mul_sigmoid_sigmoid_backward_view_0(in_out_ptr0, in_ptr0, in_ptr1, out_ptr0, xnumel, XBLOCK : tl.constexpr):
    xnumel = 52428800
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:]
    xmask = tl.full([XBLOCK], True, tl.int1)[:]
    x0 = xindex
    tmp0 = tl.load(in_ptr0 + (x0), None).to(tl.float32)
    tmp1 = tl.load(in_ptr1 + (x0), None).to(tl.float32)
    tmp5 = tl.load(in_out_ptr0 + (x0), None).to(tl.float32)
    tmp2 = tl.sigmoid(tmp1)
    tmp3 = tmp1 * tmp2
    tmp4 = tmp0 * tmp3
    tmp6 = tmp0 * tmp5
    tmp7 = tmp6 * tmp2
    tmp8 = tmp6 * tmp1
    tmp9 = tmp8.to(tl.float32)
    tmp10 = tmp2.to(tl.float32)
    tmp11 = tl.full([1], 1.0, tl.float32)
    tmp12 = tmp11 - tmp10
    tmp13 = tmp10 * tmp12
    tmp14 = tmp9 * tmp13
    tmp15 = tmp14.to(tl.float32)
    tmp16 = tmp7 + tmp15
    tl.store(out_ptr0 + (x0), tmp4, None)
    tl.store(in_out_ptr0 + (x0), tmp16, None)
''', device_str='cuda')


# kernel path: /tmp/torchinductor_root/ck/ccklt7ej26nkiv4s6yzrhnhxov3ppqvtlr2lcdlvnl7cto4ncvsr.py
# Topologically Sorted Source Nodes: [view_23, view_25, add_7, convert_element_type_39, matmul_3, x_1, x_2, mul_21, mul_22, mul_23, sum_2, pow_3, mul_24, mul_25, expand, div, pow_4, mul_26, mul_27, add_8, convert_element_type_40, add_9], Original ATen: [aten.view, aten.add, aten._to_copy, aten._unsafe_view, aten.mul, aten.sum, aten.pow, aten.expand, aten.div]
# Source node to ATen node mapping:
#   add_7 => add_7
#   add_8 => add_8
#   add_9 => add_9
#   convert_element_type_39 => convert_element_type_39
#   convert_element_type_40 => convert_element_type_40
#   div => div
#   expand => expand
#   matmul_3 => view_13
#   mul_21 => mul_21
#   mul_22 => mul_22
#   mul_23 => mul_23
#   mul_24 => mul_24
#   mul_25 => mul_25
#   mul_26 => mul_26
#   mul_27 => mul_27
#   pow_3 => pow_3
#   pow_4 => pow_4
#   sum_2 => sum_2
#   view_23 => view_23
#   view_25 => view_25
#   x_1 => add_3
#   x_2 => convert_element_type_16
# Graph fragment:
#   %mm_10 : Tensor "bf16[8192, 1600][1600, 1]cuda:0" = PlaceHolder[target=mm_10]
#   %mm_12 : Tensor "bf16[8192, 1600][1600, 1]cuda:0" = PlaceHolder[target=mm_12]
#   %primals_10 : Tensor "f32[1600][1]cuda:0" = PlaceHolder[target=primals_10]
#   %primals_1 : Tensor "bf16[4, 2048, 1600][3276800, 1600, 1]cuda:0" = PlaceHolder[target=primals_1]
#   %mm_3 : Tensor "bf16[8192, 1600][1600, 1]cuda:0" = PlaceHolder[target=mm_3]
#   %tangents_1 : Tensor "bf16[4, 2048, 1600][3276800, 1600, 1]cuda:0" = PlaceHolder[target=tangents_1]
#   %rsqrt_1 : Tensor "f32[4, 2048, 1][2048, 1, 1]cuda:0" = PlaceHolder[target=rsqrt_1]
#   %sum_2 : Tensor "f32[4, 2048, 1][2048, 1, 8192]cuda:0" = PlaceHolder[target=sum_2]
#   %view_23 : Tensor "bf16[4, 2048, 1600][3276800, 1600, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.reshape.default](args = (%mm_10, [4, 2048, 1600]), kwargs = {})
#   %view_25 : Tensor "bf16[4, 2048, 1600][3276800, 1600, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.reshape.default](args = (%mm_12, [4, 2048, 1600]), kwargs = {})
#   %add_7 : Tensor "bf16[4, 2048, 1600][3276800, 1600, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.add.Tensor](args = (%view_23, %view_25), kwargs = {})
#   %convert_element_type_39 : Tensor "f32[4, 2048, 1600][3276800, 1600, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%add_7, torch.float32), kwargs = {})
#   %view_13 : Tensor "bf16[4, 2048, 1600][3276800, 1600, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.reshape.default](args = (%mm_3, [4, 2048, 1600]), kwargs = {})
#   %add_3 : Tensor "bf16[4, 2048, 1600][3276800, 1600, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.add.Tensor](args = (%primals_1, %view_13), kwargs = {})
#   %convert_element_type_16 : Tensor "f32[4, 2048, 1600][3276800, 1600, 1]cuda:0"[num_users=3] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%add_3, torch.float32), kwargs = {})
#   %mul_21 : Tensor "f32[4, 2048, 1600][3276800, 1600, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.mul.Tensor](args = (%convert_element_type_39, %primals_10), kwargs = {})
#   %mul_22 : Tensor "f32[4, 2048, 1600][3276800, 1600, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%mul_21, %convert_element_type_16), kwargs = {})
#   %mul_23 : Tensor "f32[4, 2048, 1600][3276800, 1600, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%mul_21, %rsqrt_1), kwargs = {})
#   %sum_2 : Tensor "f32[4, 2048, 1][2048, 1, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.sum.dim_IntList](args = (%mul_22, [2], True), kwargs = {dtype: torch.float32})
#   %pow_3 : Tensor "f32[4, 2048, 1][2048, 1, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.pow.Tensor_Scalar](args = (%rsqrt_1, 3), kwargs = {})
#   %mul_24 : Tensor "f32[4, 2048, 1][2048, 1, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Scalar](args = (%sum_2, -0.5), kwargs = {})
#   %mul_25 : Tensor "f32[4, 2048, 1][2048, 1, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%mul_24, %pow_3), kwargs = {})
#   %expand : Tensor "f32[4, 2048, 1600][2048, 1, 0]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.expand.default](args = (%mul_25, [4, 2048, 1600]), kwargs = {})
#   %div : Tensor "f32[4, 2048, 1600][3276800, 1600, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.div.Scalar](args = (%expand, 1600), kwargs = {})
#   %pow_4 : Tensor "f32[4, 2048, 1600][3276800, 1600, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.pow.Tensor_Scalar](args = (%convert_element_type_16, 1.0), kwargs = {})
#   %mul_26 : Tensor "f32[4, 2048, 1600][3276800, 1600, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Scalar](args = (%pow_4, 2.0), kwargs = {})
#   %mul_27 : Tensor "f32[4, 2048, 1600][3276800, 1600, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%div, %mul_26), kwargs = {})
#   %add_8 : Tensor "f32[4, 2048, 1600][3276800, 1600, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.add.Tensor](args = (%mul_23, %mul_27), kwargs = {})
#   %convert_element_type_40 : Tensor "bf16[4, 2048, 1600][3276800, 1600, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%add_8, torch.bfloat16), kwargs = {})
#   %add_9 : Tensor "bf16[4, 2048, 1600][3276800, 1600, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.add.Tensor](args = (%tangents_1, %convert_element_type_40), kwargs = {})
#   return %sum_2,%add_9
triton_red_fused__to_copy__unsafe_view_add_div_expand_mul_pow_sum_view_1 = async_compile.triton('triton_red_fused__to_copy__unsafe_view_add_div_expand_mul_pow_sum_view_1', '''
import triton
import triton.language as tl

from torch._inductor.runtime import triton_helpers, triton_heuristics
from torch._inductor.runtime.triton_helpers import libdevice, math as tl_math
from torch._inductor.runtime.hints import AutotuneHint, ReductionHint, TileHint, DeviceProperties
triton_helpers.set_driver_to_gpu()

@triton_heuristics.reduction(
    size_hints={'x': 8192, 'r0_': 2048},
    reduction_hint=ReductionHint.INNER,
    filename=__file__,
    triton_meta={'signature': {'in_ptr0': '*bf16', 'in_ptr1': '*bf16', 'in_ptr2': '*fp32', 'in_ptr3': '*bf16', 'in_ptr4': '*bf16', 'in_ptr5': '*bf16', 'in_ptr6': '*fp32', 'out_ptr1': '*bf16', 'xnumel': 'i32', 'r0_numel': 'i32', 'XBLOCK': 'constexpr', 'R0_BLOCK': 'constexpr'}, 'device': DeviceProperties(type='cuda', index=0, multi_processor_count=132, cc=90, major=9, regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048, max_threads_per_block=1024, warp_size=32), 'constants': {}, 'native_matmul': False, 'enable_fp_fusion': True, 'launch_pdl': False, 'disable_ftz': False, 'configs': [{(0,): [['tt.divisibility', 16]], (1,): [['tt.divisibility', 16]], (2,): [['tt.divisibility', 16]], (3,): [['tt.divisibility', 16]], (4,): [['tt.divisibility', 16]], (5,): [['tt.divisibility', 16]], (6,): [['tt.divisibility', 16]], (7,): [['tt.divisibility', 16]], (8,): [['tt.divisibility', 16]], (9,): [['tt.divisibility', 16]]}]},
    inductor_meta={'grid_type': 'Grid1D', 'autotune_hints': set(), 'kernel_name': 'triton_red_fused__to_copy__unsafe_view_add_div_expand_mul_pow_sum_view_1', 'mutated_arg_names': [], 'optimize_mem': True, 'no_x_dim': False, 'atomic_add_found': False, 'num_load': 12, 'num_store': 1, 'num_reduction': 1, 'backend_hash': '91D1D1166449D9E2EB66EB9770C9E2C3B0FEB787341F27FEB4D3F0338DA50336', 'assert_indirect_indexing': True, 'autotune_local_cache': True, 'autotune_pointwise': True, 'autotune_remote_cache': None, 'force_disable_caches': False, 'dynamic_scale_rblock': True, 'max_autotune': False, 'max_autotune_pointwise': False, 'min_split_scan_rblock': 256, 'spill_threshold': 16, 'store_cubin': False, 'deterministic': False, 'force_filter_reduction_configs': False, 'mix_order_reduction_allow_multi_stages': False, 'are_deterministic_algorithms_enabled': False, 'tiling_scores': {'x': 32768, 'r0_': 183507200}}
)
@triton.jit
def triton_red_fused__to_copy__unsafe_view_add_div_expand_mul_pow_sum_view_1(in_ptr0, in_ptr1, in_ptr2, in_ptr3, in_ptr4, in_ptr5, in_ptr6, out_ptr1, xnumel, r0_numel, XBLOCK : tl.constexpr, R0_BLOCK : tl.constexpr):
    xnumel = 8192
    r0_numel = 1600
    rnumel = r0_numel
    RBLOCK: tl.constexpr = R0_BLOCK
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:, None]
    xmask = tl.full([XBLOCK], True, tl.int1)[:, None]
    r0_base = tl.arange(0, R0_BLOCK)[None, :]
    rbase = r0_base
    x0 = xindex
    _tmp12 = tl.full([XBLOCK, R0_BLOCK], 0, tl.float32)
    for r0_offset in tl.range(0, r0_numel, R0_BLOCK):
        r0_index = r0_offset + r0_base
        r0_mask = r0_index < r0_numel
        roffset = r0_offset
        rindex = r0_index
        r0_1 = r0_index
        tmp0 = tl.load(in_ptr0 + (r0_1 + 1600*x0), r0_mask, eviction_policy='evict_last', other=0.0).to(tl.float32)
        tmp1 = tl.load(in_ptr1 + (r0_1 + 1600*x0), r0_mask, eviction_policy='evict_last', other=0.0).to(tl.float32)
        tmp4 = tl.load(in_ptr2 + (r0_1), r0_mask, eviction_policy='evict_last', other=0.0)
        tmp6 = tl.load(in_ptr3 + (r0_1 + 1600*x0), r0_mask, eviction_policy='evict_last', other=0.0).to(tl.float32)
        tmp7 = tl.load(in_ptr4 + (r0_1 + 1600*x0), r0_mask, eviction_policy='evict_last', other=0.0).to(tl.float32)
        tmp2 = tmp0 + tmp1
        tmp3 = tmp2.to(tl.float32)
        tmp5 = tmp3 * tmp4
        tmp8 = tmp6 + tmp7
        tmp9 = tmp8.to(tl.float32)
        tmp10 = tmp5 * tmp9
        tmp11 = tl.broadcast_to(tmp10, [XBLOCK, R0_BLOCK])
        tmp13 = _tmp12 + tmp11
        _tmp12 = tl.where(r0_mask, tmp13, _tmp12)
    tmp12 = tl.sum(_tmp12, 1)[:, None]
    tmp21 = tl.load(in_ptr6 + (x0), None, eviction_policy='evict_last')
    for r0_offset in tl.range(0, r0_numel, R0_BLOCK):
        r0_index = r0_offset + r0_base
        r0_mask = r0_index < r0_numel
        roffset = r0_offset
        rindex = r0_index
        r0_1 = r0_index
        tmp14 = tl.load(in_ptr5 + (r0_1 + 1600*x0), r0_mask, eviction_policy='evict_first', other=0.0).to(tl.float32)
        tmp15 = tl.load(in_ptr0 + (r0_1 + 1600*x0), r0_mask, eviction_policy='evict_first', other=0.0).to(tl.float32)
        tmp16 = tl.load(in_ptr1 + (r0_1 + 1600*x0), r0_mask, eviction_policy='evict_first', other=0.0).to(tl.float32)
        tmp19 = tl.load(in_ptr2 + (r0_1), r0_mask, eviction_policy='evict_last', other=0.0)
        tmp30 = tl.load(in_ptr3 + (r0_1 + 1600*x0), r0_mask, eviction_policy='evict_first', other=0.0).to(tl.float32)
        tmp31 = tl.load(in_ptr4 + (r0_1 + 1600*x0), r0_mask, eviction_policy='evict_first', other=0.0).to(tl.float32)
        tmp17 = tmp15 + tmp16
        tmp18 = tmp17.to(tl.float32)
        tmp20 = tmp18 * tmp19
        tmp22 = tmp20 * tmp21
        tmp23 = tl.full([1, 1], -0.5, tl.float32)
        tmp24 = tmp12 * tmp23
        tmp25 = tmp21 * tmp21
        tmp26 = tmp25 * tmp21
        tmp27 = tmp24 * tmp26
        tmp28 = tl.full([1, 1], 0.000625, tl.float32)
        tmp29 = tmp27 * tmp28
        tmp32 = tmp30 + tmp31
        tmp33 = tmp32.to(tl.float32)
        tmp34 = tl.full([1, 1], 2.0, tl.float32)
        tmp35 = tmp33 * tmp34
        tmp36 = tmp29 * tmp35
        tmp37 = tmp22 + tmp36
        tmp38 = tmp37.to(tl.float32)
        tmp39 = tmp14 + tmp38
        tl.store(out_ptr1 + (r0_1 + 1600*x0), tmp39, r0_mask)
''', device_str='cuda')


# kernel path: /tmp/torchinductor_root/gp/cgpqbbpfxznbqrlk7yoo4ru3ke3mt6jekmuz3vnoxsx6muyvat7a.py
# Topologically Sorted Source Nodes: [permute_29, permute_30, convert_element_type_45, view_30, select, select_1, pos, cos, mul_28, sin, mul_29, neg, mul_30, add_10, mul_31, add_11, convert_element_type_46, full_default, convert_element_type_47, add_12, convert_element_type_48, view_31, select_2, select_3, mul_32, mul_33, neg_1, mul_34, add_13, mul_35, add_14, convert_element_type_49, convert_element_type_50, add_15], Original ATen: [aten.transpose, aten._to_copy, aten.view, aten.select, aten.unsqueeze, aten.index, aten.mul, aten.neg, aten.add, aten.slice_backward]
# Source node to ATen node mapping:
#   add_10 => add_10
#   add_11 => add_11
#   add_12 => add_12
#   add_13 => add_13
#   add_14 => add_14
#   add_15 => add_15
#   convert_element_type_45 => convert_element_type_45
#   convert_element_type_46 => convert_element_type_46
#   convert_element_type_47 => convert_element_type_47
#   convert_element_type_48 => convert_element_type_48
#   convert_element_type_49 => convert_element_type_49
#   convert_element_type_50 => convert_element_type_50
#   cos => index
#   full_default => full_default
#   mul_28 => mul_28
#   mul_29 => mul_29
#   mul_30 => mul_30
#   mul_31 => mul_31
#   mul_32 => mul_32
#   mul_33 => mul_33
#   mul_34 => mul_34
#   mul_35 => mul_35
#   neg => neg
#   neg_1 => neg_1
#   permute_29 => permute_29
#   permute_30 => permute_30
#   pos => unsqueeze
#   select => select
#   select_1 => select_1
#   select_2 => select_2
#   select_3 => select_3
#   sin => index_1
#   view_30 => view_30
#   view_31 => view_31
# Graph fragment:
#   %getitem_10 : Tensor "bf16[4, 25, 2048, 64][3276800, 64, 1600, 1]cuda:0" = PlaceHolder[target=getitem_10]
#   %primals_6 : Tensor "i64[2048][1]cuda:0" = PlaceHolder[target=primals_6]
#   %primals_7 : Tensor "f32[2048, 32][32, 1]cuda:0" = PlaceHolder[target=primals_7]
#   %primals_8 : Tensor "f32[2048, 32][32, 1]cuda:0" = PlaceHolder[target=primals_8]
#   %getitem_9 : Tensor "bf16[4, 25, 2048, 64][3276800, 64, 1600, 1]cuda:0" = PlaceHolder[target=getitem_9]
#   %permute_29 : Tensor "bf16[4, 2048, 25, 64][3276800, 1600, 64, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.permute.default](args = (%getitem_10, [0, 2, 1, 3]), kwargs = {})
#   %permute_30 : Tensor "bf16[4, 2048, 25, 64][3276800, 1600, 64, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.permute.default](args = (%getitem_9, [0, 2, 1, 3]), kwargs = {})
#   %convert_element_type_45 : Tensor "f32[4, 2048, 25, 64][3276800, 1600, 64, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%permute_29, torch.float32), kwargs = {})
#   %view_30 : Tensor "f32[4, 2048, 25, 32, 2][3276800, 1600, 64, 2, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.reshape.default](args = (%convert_element_type_45, [4, 2048, 25, 32, 2]), kwargs = {})
#   %select : Tensor "f32[4, 2048, 25, 32][3276800, 1600, 64, 2]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.select.int](args = (%view_30, -1, 0), kwargs = {})
#   %select_1 : Tensor "f32[4, 2048, 25, 32][3276800, 1600, 64, 2]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.select.int](args = (%view_30, -1, 1), kwargs = {})
#   %unsqueeze : Tensor "i64[2048, 1][1, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.unsqueeze.default](args = (%primals_6, -1), kwargs = {})
#   %index : Tensor "f32[2048, 1, 32][32, 32, 1]cuda:0"[num_users=4] = call_function[target=torch.ops.aten.index.Tensor](args = (%primals_7, [%unsqueeze]), kwargs = {})
#   %mul_28 : Tensor "f32[4, 2048, 25, 32][1638400, 800, 32, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%select_1, %index), kwargs = {})
#   %index_1 : Tensor "f32[2048, 1, 32][32, 32, 1]cuda:0"[num_users=4] = call_function[target=torch.ops.aten.index.Tensor](args = (%primals_8, [%unsqueeze]), kwargs = {})
#   %mul_29 : Tensor "f32[4, 2048, 25, 32][1638400, 800, 32, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%select_1, %index_1), kwargs = {})
#   %neg : Tensor "f32[4, 2048, 25, 32][1638400, 800, 32, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.neg.default](args = (%select,), kwargs = {})
#   %mul_30 : Tensor "f32[4, 2048, 25, 32][1638400, 800, 32, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%neg, %index_1), kwargs = {})
#   %add_10 : Tensor "f32[4, 2048, 25, 32][1638400, 800, 32, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.add.Tensor](args = (%mul_28, %mul_30), kwargs = {})
#   %mul_31 : Tensor "f32[4, 2048, 25, 32][1638400, 800, 32, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%select, %index), kwargs = {})
#   %add_11 : Tensor "f32[4, 2048, 25, 32][1638400, 800, 32, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.add.Tensor](args = (%mul_29, %mul_31), kwargs = {})
#   %convert_element_type_46 : Tensor "bf16[4, 2048, 25, 32][1638400, 800, 32, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%add_10, torch.bfloat16), kwargs = {})
#   %full_default : Tensor "bf16[4, 2048, 25, 64][3276800, 1600, 64, 1]cuda:0"[num_users=4] = call_function[target=torch.ops.aten.full.default](args = ([4, 2048, 25, 64], 0), kwargs = {dtype: torch.bfloat16, layout: torch.strided, device: cuda:0, pin_memory: False})
#   %slice_scatter_default : Tensor "bf16[4, 2048, 25, 64][3276800, 1600, 64, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.slice_scatter.default](args = (%full_default, %convert_element_type_46, 3, 1, 9223372036854775807, 2), kwargs = {})
#   %convert_element_type_47 : Tensor "bf16[4, 2048, 25, 32][1638400, 800, 32, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%add_11, torch.bfloat16), kwargs = {})
#   %slice_scatter_default_1 : Tensor "bf16[4, 2048, 25, 64][3276800, 1600, 64, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.slice_scatter.default](args = (%full_default, %convert_element_type_47, 3, 0, 9223372036854775807, 2), kwargs = {})
#   %add_12 : Tensor "bf16[4, 2048, 25, 64][3276800, 1600, 64, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.add.Tensor](args = (%slice_scatter_default, %slice_scatter_default_1), kwargs = {})
#   %convert_element_type_48 : Tensor "f32[4, 2048, 25, 64][3276800, 1600, 64, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%permute_30, torch.float32), kwargs = {})
#   %view_31 : Tensor "f32[4, 2048, 25, 32, 2][3276800, 1600, 64, 2, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.reshape.default](args = (%convert_element_type_48, [4, 2048, 25, 32, 2]), kwargs = {})
#   %select_2 : Tensor "f32[4, 2048, 25, 32][3276800, 1600, 64, 2]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.select.int](args = (%view_31, -1, 0), kwargs = {})
#   %select_3 : Tensor "f32[4, 2048, 25, 32][3276800, 1600, 64, 2]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.select.int](args = (%view_31, -1, 1), kwargs = {})
#   %mul_32 : Tensor "f32[4, 2048, 25, 32][1638400, 800, 32, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%select_3, %index), kwargs = {})
#   %mul_33 : Tensor "f32[4, 2048, 25, 32][1638400, 800, 32, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%select_3, %index_1), kwargs = {})
#   %neg_1 : Tensor "f32[4, 2048, 25, 32][1638400, 800, 32, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.neg.default](args = (%select_2,), kwargs = {})
#   %mul_34 : Tensor "f32[4, 2048, 25, 32][1638400, 800, 32, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%neg_1, %index_1), kwargs = {})
#   %add_13 : Tensor "f32[4, 2048, 25, 32][1638400, 800, 32, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.add.Tensor](args = (%mul_32, %mul_34), kwargs = {})
#   %mul_35 : Tensor "f32[4, 2048, 25, 32][1638400, 800, 32, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%select_2, %index), kwargs = {})
#   %add_14 : Tensor "f32[4, 2048, 25, 32][1638400, 800, 32, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.add.Tensor](args = (%mul_33, %mul_35), kwargs = {})
#   %convert_element_type_49 : Tensor "bf16[4, 2048, 25, 32][1638400, 800, 32, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%add_13, torch.bfloat16), kwargs = {})
#   %slice_scatter_default_2 : Tensor "bf16[4, 2048, 25, 64][3276800, 1600, 64, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.slice_scatter.default](args = (%full_default, %convert_element_type_49, 3, 1, 9223372036854775807, 2), kwargs = {})
#   %convert_element_type_50 : Tensor "bf16[4, 2048, 25, 32][1638400, 800, 32, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%add_14, torch.bfloat16), kwargs = {})
#   %slice_scatter_default_3 : Tensor "bf16[4, 2048, 25, 64][3276800, 1600, 64, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.slice_scatter.default](args = (%full_default, %convert_element_type_50, 3, 0, 9223372036854775807, 2), kwargs = {})
#   %add_15 : Tensor "bf16[4, 2048, 25, 64][3276800, 1600, 64, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.add.Tensor](args = (%slice_scatter_default_2, %slice_scatter_default_3), kwargs = {})
#   return %add_12,%add_15
triton_poi_fused__to_copy_add_index_mul_neg_select_slice_backward_transpose_unsqueeze_view_2 = async_compile.triton('triton_poi_fused__to_copy_add_index_mul_neg_select_slice_backward_transpose_unsqueeze_view_2', '''
import triton
import triton.language as tl

from torch._inductor.runtime import triton_helpers, triton_heuristics
from torch._inductor.runtime.triton_helpers import libdevice, math as tl_math
from torch._inductor.runtime.hints import AutotuneHint, ReductionHint, TileHint, DeviceProperties
triton_helpers.set_driver_to_gpu()

@triton_heuristics.pointwise(
    size_hints={'x': 16777216}, 
    filename=__file__,
    triton_meta={'signature': {'in_ptr0': '*bf16', 'in_ptr1': '*i64', 'in_ptr2': '*fp32', 'in_ptr3': '*fp32', 'in_ptr4': '*bf16', 'out_ptr0': '*bf16', 'out_ptr1': '*bf16', 'xnumel': 'i32', 'XBLOCK': 'constexpr'}, 'device': DeviceProperties(type='cuda', index=0, multi_processor_count=132, cc=90, major=9, regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048, max_threads_per_block=1024, warp_size=32), 'constants': {}, 'native_matmul': False, 'enable_fp_fusion': True, 'launch_pdl': False, 'disable_ftz': False, 'configs': [{(0,): [['tt.divisibility', 16]], (1,): [['tt.divisibility', 16]], (2,): [['tt.divisibility', 16]], (3,): [['tt.divisibility', 16]], (4,): [['tt.divisibility', 16]], (5,): [['tt.divisibility', 16]], (6,): [['tt.divisibility', 16]], (7,): [['tt.divisibility', 16]]}]},
    inductor_meta={'grid_type': 'Grid1D', 'autotune_hints': set(), 'kernel_name': 'triton_poi_fused__to_copy_add_index_mul_neg_select_slice_backward_transpose_unsqueeze_view_2', 'mutated_arg_names': [], 'optimize_mem': True, 'no_x_dim': False, 'atomic_add_found': False, 'num_load': 10, 'num_store': 2, 'num_reduction': 0, 'backend_hash': '91D1D1166449D9E2EB66EB9770C9E2C3B0FEB787341F27FEB4D3F0338DA50336', 'assert_indirect_indexing': True, 'autotune_local_cache': True, 'autotune_pointwise': True, 'autotune_remote_cache': None, 'force_disable_caches': False, 'dynamic_scale_rblock': True, 'max_autotune': False, 'max_autotune_pointwise': False, 'min_split_scan_rblock': 256, 'spill_threshold': 16, 'store_cubin': False, 'deterministic': False, 'force_filter_reduction_configs': False, 'mix_order_reduction_allow_multi_stages': False, 'are_deterministic_algorithms_enabled': False, 'tiling_scores': {'x': 209715200}},
    min_elem_per_thread=0
)
@triton.jit
def triton_poi_fused__to_copy_add_index_mul_neg_select_slice_backward_transpose_unsqueeze_view_2(in_ptr0, in_ptr1, in_ptr2, in_ptr3, in_ptr4, out_ptr0, out_ptr1, xnumel, XBLOCK : tl.constexpr):
    xnumel = 13107200
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:]
    xmask = tl.full([XBLOCK], True, tl.int1)[:]
    x0 = (xindex % 64)
    x4 = xindex // 64
    x2 = ((xindex // 1600) % 2048)
    x5 = xindex
    tmp0 = x0
    tmp1 = tl.full([1], 1, tl.int64)
    tmp2 = tmp0 >= tmp1
    tmp3 = (((-1) + x0) % 2)
    tmp4 = tl.full([1], 0, tl.int64)
    tmp5 = tmp3 == tmp4
    tmp6 = tmp2 & tmp5
    tmp7 = tl.load(in_ptr0 + (1 + 2*(triton_helpers.div_floor_integer((-1) + x0,  2)) + 64*x4), tmp6, eviction_policy='evict_last', other=0.0).to(tl.float32)
    tmp8 = tmp7.to(tl.float32)
    tmp9 = tl.load(in_ptr1 + (x2), tmp6, eviction_policy='evict_last', other=0.0)
    tmp10 = tl.full([XBLOCK], 2048, tl.int32)
    tmp11 = tmp9 + tmp10
    tmp12 = tmp9 < 0
    tmp13 = tl.where(tmp12, tmp11, tmp9)
    tl.device_assert(((0 <= tl.broadcast_to(tmp13, [XBLOCK])) & (tl.broadcast_to(tmp13, [XBLOCK]) < 2048)) | ~(tmp6), "index out of bounds: 0 <= tl.broadcast_to(tmp13, [XBLOCK]) < 2048")
    tmp15 = tl.load(in_ptr2 + (32*tmp13 + (triton_helpers.div_floor_integer((-1) + x0,  2))), tmp6, other=0.0)
    tmp16 = tmp8 * tmp15
    tmp17 = tl.load(in_ptr0 + (2*(triton_helpers.div_floor_integer((-1) + x0,  2)) + 64*x4), tmp6, eviction_policy='evict_last', other=0.0).to(tl.float32)
    tmp18 = tmp17.to(tl.float32)
    tmp19 = -tmp18
    tmp20 = tl.load(in_ptr3 + (32*tmp13 + (triton_helpers.div_floor_integer((-1) + x0,  2))), tmp6, other=0.0)
    tmp21 = tmp19 * tmp20
    tmp22 = tmp16 + tmp21
    tmp23 = tmp22.to(tl.float32)
    tmp24 = tl.full(tmp23.shape, 0.0, tmp23.dtype)
    tmp25 = tl.where(tmp6, tmp23, tmp24)
    tmp26 = tl.full([1], 0.0, tl.float32)
    tmp27 = tl.where(tmp6, tmp25, tmp26)
    tmp28 = (x5 % 2)
    tmp29 = tmp28 == tmp4
    tmp30 = tl.load(in_ptr0 + (1 + 2*(x0 // 2) + 64*x4), tmp29, eviction_policy='evict_last', other=0.0).to(tl.float32)
    tmp31 = tmp30.to(tl.float32)
    tmp32 = tl.load(in_ptr1 + (x2), tmp29, eviction_policy='evict_last', other=0.0)
    tmp33 = tl.full([XBLOCK], 2048, tl.int32)
    tmp34 = tmp32 + tmp33
    tmp35 = tmp32 < 0
    tmp36 = tl.where(tmp35, tmp34, tmp32)
    tl.device_assert(((0 <= tl.broadcast_to(tmp36, [XBLOCK])) & (tl.broadcast_to(tmp36, [XBLOCK]) < 2048)) | ~(tmp29), "index out of bounds: 0 <= tl.broadcast_to(tmp36, [XBLOCK]) < 2048")
    tmp38 = tl.load(in_ptr3 + (32*tmp36 + (x0 // 2)), tmp29, eviction_policy='evict_last', other=0.0)
    tmp39 = tmp31 * tmp38
    tmp40 = tl.load(in_ptr0 + (2*(x0 // 2) + 64*x4), tmp29, eviction_policy='evict_last', other=0.0).to(tl.float32)
    tmp41 = tmp40.to(tl.float32)
    tmp42 = tl.load(in_ptr2 + (32*tmp36 + (x0 // 2)), tmp29, eviction_policy='evict_last', other=0.0)
    tmp43 = tmp41 * tmp42
    tmp44 = tmp39 + tmp43
    tmp45 = tmp44.to(tl.float32)
    tmp46 = tl.full(tmp45.shape, 0.0, tmp45.dtype)
    tmp47 = tl.where(tmp29, tmp45, tmp46)
    tmp48 = tl.where(tmp29, tmp47, tmp26)
    tmp49 = tmp27 + tmp48
    tmp50 = tl.load(in_ptr4 + (1 + 2*(triton_helpers.div_floor_integer((-1) + x0,  2)) + 64*x4), tmp6, eviction_policy='evict_last', other=0.0).to(tl.float32)
    tmp51 = tmp50.to(tl.float32)
    tmp52 = tmp51 * tmp15
    tmp53 = tl.load(in_ptr4 + (2*(triton_helpers.div_floor_integer((-1) + x0,  2)) + 64*x4), tmp6, eviction_policy='evict_last', other=0.0).to(tl.float32)
    tmp54 = tmp53.to(tl.float32)
    tmp55 = -tmp54
    tmp56 = tmp55 * tmp20
    tmp57 = tmp52 + tmp56
    tmp58 = tmp57.to(tl.float32)
    tmp59 = tl.full(tmp58.shape, 0.0, tmp58.dtype)
    tmp60 = tl.where(tmp6, tmp58, tmp59)
    tmp61 = tl.where(tmp6, tmp60, tmp26)
    tmp62 = tl.load(in_ptr4 + (1 + 2*(x0 // 2) + 64*x4), tmp29, eviction_policy='evict_last', other=0.0).to(tl.float32)
    tmp63 = tmp62.to(tl.float32)
    tmp64 = tmp63 * tmp38
    tmp65 = tl.load(in_ptr4 + (2*(x0 // 2) + 64*x4), tmp29, eviction_policy='evict_last', other=0.0).to(tl.float32)
    tmp66 = tmp65.to(tl.float32)
    tmp67 = tmp66 * tmp42
    tmp68 = tmp64 + tmp67
    tmp69 = tmp68.to(tl.float32)
    tmp70 = tl.full(tmp69.shape, 0.0, tmp69.dtype)
    tmp71 = tl.where(tmp29, tmp69, tmp70)
    tmp72 = tl.where(tmp29, tmp71, tmp26)
    tmp73 = tmp61 + tmp72
    tl.store(out_ptr0 + (x5), tmp49, None)
    tl.store(out_ptr1 + (x5), tmp73, None)
''', device_str='cuda')


# kernel path: /tmp/torchinductor_root/xn/cxnkeyhgufrqistei6q75deatxzjysy2mu7skxcrqkvwhm64eai7.py
# Topologically Sorted Source Nodes: [view_23, view_25, add_7, convert_element_type_39, matmul_3, x_1, x_2, mul_10, mul_20, sum_1, view_34, view_37, add_16, view_40, add_17, convert_element_type_63, x, mul, mul_36, mul_37, sum_3, mul_38, mul_39, sum_4, pow_5, mul_40, mul_41, expand_1, div_1, pow_6, mul_42, mul_43, add_18, convert_element_type_64, add_19], Original ATen: [aten.view, aten.add, aten._to_copy, aten._unsafe_view, aten.mul, aten.sum, aten.pow, aten.expand, aten.div]
# Source node to ATen node mapping:
#   add_16 => add_16
#   add_17 => add_17
#   add_18 => add_18
#   add_19 => add_19
#   add_7 => add_7
#   convert_element_type_39 => convert_element_type_39
#   convert_element_type_63 => convert_element_type_63
#   convert_element_type_64 => convert_element_type_64
#   div_1 => div_1
#   expand_1 => expand_1
#   matmul_3 => view_13
#   mul => mul
#   mul_10 => mul_10
#   mul_20 => mul_20
#   mul_36 => mul_36
#   mul_37 => mul_37
#   mul_38 => mul_38
#   mul_39 => mul_39
#   mul_40 => mul_40
#   mul_41 => mul_41
#   mul_42 => mul_42
#   mul_43 => mul_43
#   pow_5 => pow_5
#   pow_6 => pow_6
#   sum_1 => sum_1
#   sum_3 => sum_3
#   sum_4 => sum_4
#   view_23 => view_23
#   view_25 => view_25
#   view_34 => view_34
#   view_37 => view_37
#   view_40 => view_40
#   x => convert_element_type
#   x_1 => add_3
#   x_2 => convert_element_type_16
# Graph fragment:
#   %mm_16 : Tensor "bf16[8192, 1600][1600, 1]cuda:0" = PlaceHolder[target=mm_16]
#   %mm_18 : Tensor "bf16[8192, 1600][1600, 1]cuda:0" = PlaceHolder[target=mm_18]
#   %mm_20 : Tensor "bf16[8192, 1600][1600, 1]cuda:0" = PlaceHolder[target=mm_20]
#   %primals_2 : Tensor "f32[1600][1]cuda:0" = PlaceHolder[target=primals_2]
#   %primals_1 : Tensor "bf16[4, 2048, 1600][3276800, 1600, 1]cuda:0" = PlaceHolder[target=primals_1]
#   %add_9 : Tensor "bf16[4, 2048, 1600][3276800, 1600, 1]cuda:0" = PlaceHolder[target=add_9]
#   %rsqrt : Tensor "f32[4, 2048, 1][2048, 1, 1]cuda:0" = PlaceHolder[target=rsqrt]
#   %sum_4 : Tensor "f32[4, 2048, 1][2048, 1, 8192]cuda:0" = PlaceHolder[target=sum_4]
#   %mm_10 : Tensor "bf16[8192, 1600][1600, 1]cuda:0" = PlaceHolder[target=mm_10]
#   %mm_12 : Tensor "bf16[8192, 1600][1600, 1]cuda:0" = PlaceHolder[target=mm_12]
#   %mm_3 : Tensor "bf16[8192, 1600][1600, 1]cuda:0" = PlaceHolder[target=mm_3]
#   %rsqrt_1 : Tensor "f32[4, 2048, 1][2048, 1, 1]cuda:0" = PlaceHolder[target=rsqrt_1]
#   %view_23 : Tensor "bf16[4, 2048, 1600][3276800, 1600, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.reshape.default](args = (%mm_10, [4, 2048, 1600]), kwargs = {})
#   %view_25 : Tensor "bf16[4, 2048, 1600][3276800, 1600, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.reshape.default](args = (%mm_12, [4, 2048, 1600]), kwargs = {})
#   %add_7 : Tensor "bf16[4, 2048, 1600][3276800, 1600, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.add.Tensor](args = (%view_23, %view_25), kwargs = {})
#   %convert_element_type_39 : Tensor "f32[4, 2048, 1600][3276800, 1600, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%add_7, torch.float32), kwargs = {})
#   %view_13 : Tensor "bf16[4, 2048, 1600][3276800, 1600, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.reshape.default](args = (%mm_3, [4, 2048, 1600]), kwargs = {})
#   %add_3 : Tensor "bf16[4, 2048, 1600][3276800, 1600, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.add.Tensor](args = (%primals_1, %view_13), kwargs = {})
#   %convert_element_type_16 : Tensor "f32[4, 2048, 1600][3276800, 1600, 1]cuda:0"[num_users=3] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%add_3, torch.float32), kwargs = {})
#   %mul_10 : Tensor "f32[4, 2048, 1600][3276800, 1600, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%convert_element_type_16, %rsqrt_1), kwargs = {})
#   %mul_20 : Tensor "f32[4, 2048, 1600][3276800, 1600, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%convert_element_type_39, %mul_10), kwargs = {})
#   %sum_1 : Tensor "f32[1, 1, 1600][1600, 1600, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.sum.dim_IntList](args = (%mul_20, [0, 1], True), kwargs = {dtype: torch.float32})
#   %view_34 : Tensor "bf16[4, 2048, 1600][3276800, 1600, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.reshape.default](args = (%mm_16, [4, 2048, 1600]), kwargs = {})
#   %view_37 : Tensor "bf16[4, 2048, 1600][3276800, 1600, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.reshape.default](args = (%mm_18, [4, 2048, 1600]), kwargs = {})
#   %add_16 : Tensor "bf16[4, 2048, 1600][3276800, 1600, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.add.Tensor](args = (%view_34, %view_37), kwargs = {})
#   %view_40 : Tensor "bf16[4, 2048, 1600][3276800, 1600, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.reshape.default](args = (%mm_20, [4, 2048, 1600]), kwargs = {})
#   %add_17 : Tensor "bf16[4, 2048, 1600][3276800, 1600, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.add.Tensor](args = (%add_16, %view_40), kwargs = {})
#   %convert_element_type_63 : Tensor "f32[4, 2048, 1600][3276800, 1600, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%add_17, torch.float32), kwargs = {})
#   %convert_element_type : Tensor "f32[4, 2048, 1600][3276800, 1600, 1]cuda:0"[num_users=3] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%primals_1, torch.float32), kwargs = {})
#   %mul : Tensor "f32[4, 2048, 1600][3276800, 1600, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%convert_element_type, %rsqrt), kwargs = {})
#   %mul_36 : Tensor "f32[4, 2048, 1600][3276800, 1600, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%convert_element_type_63, %mul), kwargs = {})
#   %mul_37 : Tensor "f32[4, 2048, 1600][3276800, 1600, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.mul.Tensor](args = (%convert_element_type_63, %primals_2), kwargs = {})
#   %sum_3 : Tensor "f32[1, 1, 1600][1600, 1600, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.sum.dim_IntList](args = (%mul_36, [0, 1], True), kwargs = {dtype: torch.float32})
#   %mul_38 : Tensor "f32[4, 2048, 1600][3276800, 1600, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%mul_37, %convert_element_type), kwargs = {})
#   %mul_39 : Tensor "f32[4, 2048, 1600][3276800, 1600, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%mul_37, %rsqrt), kwargs = {})
#   %sum_4 : Tensor "f32[4, 2048, 1][2048, 1, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.sum.dim_IntList](args = (%mul_38, [2], True), kwargs = {dtype: torch.float32})
#   %pow_5 : Tensor "f32[4, 2048, 1][2048, 1, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.pow.Tensor_Scalar](args = (%rsqrt, 3), kwargs = {})
#   %mul_40 : Tensor "f32[4, 2048, 1][2048, 1, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Scalar](args = (%sum_4, -0.5), kwargs = {})
#   %mul_41 : Tensor "f32[4, 2048, 1][2048, 1, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%mul_40, %pow_5), kwargs = {})
#   %expand_1 : Tensor "f32[4, 2048, 1600][2048, 1, 0]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.expand.default](args = (%mul_41, [4, 2048, 1600]), kwargs = {})
#   %div_1 : Tensor "f32[4, 2048, 1600][3276800, 1600, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.div.Scalar](args = (%expand_1, 1600), kwargs = {})
#   %pow_6 : Tensor "f32[4, 2048, 1600][3276800, 1600, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.pow.Tensor_Scalar](args = (%convert_element_type, 1.0), kwargs = {})
#   %mul_42 : Tensor "f32[4, 2048, 1600][3276800, 1600, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Scalar](args = (%pow_6, 2.0), kwargs = {})
#   %mul_43 : Tensor "f32[4, 2048, 1600][3276800, 1600, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%div_1, %mul_42), kwargs = {})
#   %add_18 : Tensor "f32[4, 2048, 1600][3276800, 1600, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.add.Tensor](args = (%mul_39, %mul_43), kwargs = {})
#   %convert_element_type_64 : Tensor "bf16[4, 2048, 1600][3276800, 1600, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%add_18, torch.bfloat16), kwargs = {})
#   %add_19 : Tensor "bf16[4, 2048, 1600][3276800, 1600, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.add.Tensor](args = (%add_9, %convert_element_type_64), kwargs = {})
#   return %sum_4,%add_19
triton_per_fused__to_copy__unsafe_view_add_div_expand_mul_pow_sum_view_3 = async_compile.triton('triton_per_fused__to_copy__unsafe_view_add_div_expand_mul_pow_sum_view_3', '''
import triton
import triton.language as tl

from torch._inductor.runtime import triton_helpers, triton_heuristics
from torch._inductor.runtime.triton_helpers import libdevice, math as tl_math
from torch._inductor.runtime.hints import AutotuneHint, ReductionHint, TileHint, DeviceProperties
triton_helpers.set_driver_to_gpu()

@triton_heuristics.persistent_reduction(
    size_hints={'x': 8192, 'r0_': 2048},
    reduction_hint=ReductionHint.INNER,
    filename=__file__,
    triton_meta={'signature': {'in_ptr0': '*bf16', 'in_ptr1': '*bf16', 'in_ptr2': '*bf16', 'in_ptr3': '*fp32', 'in_ptr4': '*bf16', 'in_ptr5': '*bf16', 'in_ptr6': '*fp32', 'in_ptr7': '*bf16', 'in_ptr8': '*bf16', 'in_ptr9': '*bf16', 'in_ptr10': '*fp32', 'out_ptr1': '*bf16', 'ws_ptr': '*fp32', 'xnumel': 'i32', 'r0_numel': 'i32', 'XBLOCK': 'constexpr', 'RSPLIT_SIZE': 'constexpr', 'NUM_STAGES': 'constexpr'}, 'device': DeviceProperties(type='cuda', index=0, multi_processor_count=132, cc=90, major=9, regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048, max_threads_per_block=1024, warp_size=32), 'constants': {}, 'native_matmul': False, 'enable_fp_fusion': True, 'launch_pdl': False, 'disable_ftz': False, 'configs': [{(0,): [['tt.divisibility', 16]], (1,): [['tt.divisibility', 16]], (2,): [['tt.divisibility', 16]], (3,): [['tt.divisibility', 16]], (4,): [['tt.divisibility', 16]], (5,): [['tt.divisibility', 16]], (6,): [['tt.divisibility', 16]], (7,): [['tt.divisibility', 16]], (8,): [['tt.divisibility', 16]], (9,): [['tt.divisibility', 16]], (10,): [['tt.divisibility', 16]], (11,): [['tt.divisibility', 16]], (12,): [['tt.divisibility', 16]], (13,): [['tt.divisibility', 16]], (14,): [['tt.divisibility', 16]]}]},
    inductor_meta={'grid_type': 'MixOrderReductionGrid', 'autotune_hints': set(), 'kernel_name': 'triton_per_fused__to_copy__unsafe_view_add_div_expand_mul_pow_sum_view_3', 'mutated_arg_names': [], 'optimize_mem': True, 'no_x_dim': None, 'atomic_add_found': False, 'num_load': 11, 'num_store': 0, 'num_reduction': 1, 'backend_hash': '91D1D1166449D9E2EB66EB9770C9E2C3B0FEB787341F27FEB4D3F0338DA50336', 'assert_indirect_indexing': True, 'autotune_local_cache': True, 'autotune_pointwise': True, 'autotune_remote_cache': None, 'force_disable_caches': False, 'dynamic_scale_rblock': True, 'max_autotune': False, 'max_autotune_pointwise': False, 'min_split_scan_rblock': 256, 'spill_threshold': 16, 'store_cubin': False, 'deterministic': False, 'force_filter_reduction_configs': False, 'mix_order_reduction_allow_multi_stages': False, 'are_deterministic_algorithms_enabled': False, 'RSPLIT_SIZE': 16}
)
@triton.jit
def triton_per_fused__to_copy__unsafe_view_add_div_expand_mul_pow_sum_view_3(in_ptr0, in_ptr1, in_ptr2, in_ptr3, in_ptr4, in_ptr5, in_ptr6, in_ptr7, in_ptr8, in_ptr9, in_ptr10, out_ptr1, ws_ptr, xnumel, r0_numel, XBLOCK : tl.constexpr, RSPLIT_SIZE : tl.constexpr, NUM_STAGES : tl.constexpr):
    xnumel = 8192
    r0_numel = 1600
    R0_BLOCK: tl.constexpr = 2048
    rnumel = r0_numel
    RBLOCK: tl.constexpr = R0_BLOCK
    xoffset = tl.program_id(0) * RSPLIT_SIZE
    xindex = xoffset + tl.arange(0, XBLOCK)[:, None]
    xmask = tl.full([XBLOCK], True, tl.int1)[:, None]
    r0_index = tl.arange(0, R0_BLOCK)[None, :]
    r0_offset = 0
    r0_mask = r0_index < r0_numel
    roffset = r0_offset
    rindex = r0_index
    r0_1 = r0_index
    accum0 = tl.full([R0_BLOCK], 0, tl.float32)[None, :]
    accum1 = tl.full([R0_BLOCK], 0, tl.float32)[None, :]
    split_size = min(RSPLIT_SIZE, xnumel - xoffset)
    for _ in tl.range(0, split_size, XBLOCK, num_stages=NUM_STAGES):
        x0 = xindex
        xindex += XBLOCK
        tmp0 = tl.load(in_ptr0 + (r0_1 + 1600*x0), r0_mask, other=0.0).to(tl.float32)
        tmp1 = tl.load(in_ptr1 + (r0_1 + 1600*x0), r0_mask, other=0.0).to(tl.float32)
        tmp3 = tl.load(in_ptr2 + (r0_1 + 1600*x0), r0_mask, other=0.0).to(tl.float32)
        tmp6 = tl.load(in_ptr3 + (r0_1), r0_mask, eviction_policy='evict_last', other=0.0)
        tmp8 = tl.load(in_ptr4 + (r0_1 + 1600*x0), r0_mask, other=0.0).to(tl.float32)
        tmp15 = tl.load(in_ptr5 + (r0_1 + 1600*x0), r0_mask, other=0.0).to(tl.float32)
        tmp16 = tl.load(in_ptr6 + (x0), None, eviction_policy='evict_last')
        tmp31 = tl.load(in_ptr7 + (r0_1 + 1600*x0), r0_mask, other=0.0).to(tl.float32)
        tmp32 = tl.load(in_ptr8 + (r0_1 + 1600*x0), r0_mask, other=0.0).to(tl.float32)
        tmp35 = tl.load(in_ptr9 + (r0_1 + 1600*x0), r0_mask, other=0.0).to(tl.float32)
        tmp38 = tl.load(in_ptr10 + (x0), None, eviction_policy='evict_last')
        tmp2 = tmp0 + tmp1
        tmp4 = tmp2 + tmp3
        tmp5 = tmp4.to(tl.float32)
        tmp7 = tmp5 * tmp6
        tmp9 = tmp8.to(tl.float32)
        tmp10 = tmp7 * tmp9
        tmp11 = tl.broadcast_to(tmp10, [XBLOCK, R0_BLOCK])
        tmp13 = tl.where(r0_mask, tmp11, 0)
        tmp14 = tl.sum(tmp13, 1)[:, None].to(tl.float32)
        tmp17 = tmp7 * tmp16
        tmp18 = tl.full([1, 1], -0.5, tl.float32)
        tmp19 = tmp14 * tmp18
        tmp20 = tmp16 * tmp16
        tmp21 = tmp20 * tmp16
        tmp22 = tmp19 * tmp21
        tmp23 = tl.full([1, 1], 0.000625, tl.float32)
        tmp24 = tmp22 * tmp23
        tmp25 = tl.full([1, 1], 2.0, tl.float32)
        tmp26 = tmp9 * tmp25
        tmp27 = tmp24 * tmp26
        tmp28 = tmp17 + tmp27
        tmp29 = tmp28.to(tl.float32)
        tmp30 = tmp15 + tmp29
        tmp33 = tmp31 + tmp32
        tmp34 = tmp33.to(tl.float32)
        tmp36 = tmp8 + tmp35
        tmp37 = tmp36.to(tl.float32)
        tmp39 = tmp37 * tmp38
        tmp40 = tmp34 * tmp39
        tmp41 = tmp9 * tmp16
        tmp42 = tmp5 * tmp41
        tl.store(out_ptr1 + (r0_1 + 1600*x0), tmp30, r0_mask)
        tmp43 = tl.sum(tmp40, 0)
        tmp44 = accum0 + tmp43
        accum0 = tmp44
        tmp45 = tl.sum(tmp42, 0)
        tmp46 = accum1 + tmp45
        accum1 = tmp46
    tl.store(ws_ptr + (tl.program_id(0) + 0 * tl.num_programs(0)) * r0_numel + r0_index, accum0, r0_mask)
    tl.store(ws_ptr + (tl.program_id(0) + 1 * tl.num_programs(0)) * r0_numel + r0_index, accum1, r0_mask)
''', device_str='cuda')


async_compile.wait(globals())
del async_compile

class Runner:
    def __init__(self, partitions):
        self.partitions = partitions

    def recursively_apply_fns(self, fns):
        new_callables = []
        for fn, c in zip(fns, self.partitions):
            new_callables.append(fn(c))
        self.partitions = new_callables

    def call(self, args):
        primals_1, primals_2, primals_3, primals_4, primals_5, primals_6, primals_7, primals_8, primals_9, primals_10, primals_11, primals_12, primals_13, rsqrt, view, permute_3, permute_4, permute_5, getitem, getitem_1, getitem_6, getitem_7, mm_3, rsqrt_1, view_14, mm_4, mm_5, view_18, tangents_1 = args
        args.clear()
        assert_size_stride(primals_1, (4, 2048, 1600), (3276800, 1600, 1))
        assert_size_stride(primals_2, (1600, ), (1, ))
        assert_size_stride(primals_3, (1600, 1600), (1600, 1))
        assert_size_stride(primals_4, (1600, 1600), (1600, 1))
        assert_size_stride(primals_5, (1600, 1600), (1600, 1))
        assert_size_stride(primals_6, (2048, ), (1, ))
        assert_size_stride(primals_7, (2048, 32), (32, 1))
        assert_size_stride(primals_8, (2048, 32), (32, 1))
        assert_size_stride(primals_9, (1600, 1600), (1600, 1))
        assert_size_stride(primals_10, (1600, ), (1, ))
        assert_size_stride(primals_11, (6400, 1600), (1600, 1))
        assert_size_stride(primals_12, (6400, 1600), (1600, 1))
        assert_size_stride(primals_13, (1600, 6400), (6400, 1))
        assert_size_stride(rsqrt, (4, 2048, 1), (2048, 1, 1))
        assert_size_stride(view, (8192, 1600), (1600, 1))
        assert_size_stride(permute_3, (4, 25, 2048, 64), (3276800, 64, 1600, 1))
        assert_size_stride(permute_4, (4, 25, 2048, 64), (3276800, 64, 1600, 1))
        assert_size_stride(permute_5, (4, 25, 2048, 64), (3276800, 64, 1600, 1))
        assert_size_stride(getitem, (4, 25, 2048, 64), (3276800, 64, 1600, 1))
        assert_size_stride(getitem_1, (4, 25, 2048, 1), (51200, 2048, 1, 1))
        assert_size_stride(getitem_6, (), ())
        assert_size_stride(getitem_7, (), ())
        assert_size_stride(mm_3, (8192, 1600), (1600, 1))
        assert_size_stride(rsqrt_1, (4, 2048, 1), (2048, 1, 1))
        assert_size_stride(view_14, (8192, 1600), (1600, 1))
        assert_size_stride(mm_4, (8192, 6400), (6400, 1))
        assert_size_stride(mm_5, (8192, 6400), (6400, 1))
        assert_size_stride(view_18, (8192, 6400), (6400, 1))
        assert_size_stride(tangents_1, (4, 2048, 1600), (3276800, 1600, 1))
        with torch.cuda._DeviceGuard(0):
            torch.cuda.set_device(0)
            buf0 = empty_strided_cuda((1600, 6400), (6400, 1), torch.bfloat16)
            # Topologically Sorted Source Nodes: [view_20, permute_11, mm_7], Original ATen: [aten.view, aten.t, aten.mm]
            extern_kernels.mm(reinterpret_tensor(tangents_1, (1600, 8192), (1, 1600), 0), view_18, out=buf0)
            del view_18
            buf1 = empty_strided_cuda((8192, 6400), (6400, 1), torch.bfloat16)
            # Topologically Sorted Source Nodes: [view_20, getattr_7, permute_13, mm_8], Original ATen: [aten.view, aten.permute, aten.t, aten.mm]
            extern_kernels.mm(reinterpret_tensor(tangents_1, (8192, 1600), (1600, 1), 0), primals_13, out=buf1)
            del primals_13
            buf2 = empty_strided_cuda((4, 2048, 6400), (13107200, 6400, 1), torch.bfloat16)
            buf5 = reinterpret_tensor(mm_5, (4, 2048, 6400), (13107200, 6400, 1), 0); del mm_5  # reuse
            # Topologically Sorted Source Nodes: [view_21, matmul_4, sigmoid, mul_12, mul_14, matmul_5, mul_15, mul_16, mul_17, convert_element_type_32, convert_element_type_33, sub_2, mul_18, mul_19, convert_element_type_34, add_6], Original ATen: [aten.view, aten._unsafe_view, aten.sigmoid, aten.mul, aten.sigmoid_backward, aten.add]
            stream0 = get_raw_stream(0)
            triton_poi_fused__unsafe_view_add_mul_sigmoid_sigmoid_backward_view_0.run(buf5, buf1, mm_4, buf2, 52428800, stream=stream0)
            del buf1
            del mm_4
            buf3 = empty_strided_cuda((6400, 1600), (1600, 1), torch.bfloat16)
            # Topologically Sorted Source Nodes: [view_21, matmul_4, sigmoid, mul_12, mul_14, view_22, permute_15, mm_9], Original ATen: [aten.view, aten._unsafe_view, aten.sigmoid, aten.mul, aten.t, aten.mm]
            extern_kernels.mm(reinterpret_tensor(buf2, (6400, 8192), (1, 6400), 0), view_14, out=buf3)
            buf4 = empty_strided_cuda((8192, 1600), (1600, 1), torch.bfloat16)
            # Topologically Sorted Source Nodes: [view_21, matmul_4, sigmoid, mul_12, mul_14, view_22, getattr_6, permute_17, mm_10], Original ATen: [aten.view, aten._unsafe_view, aten.sigmoid, aten.mul, aten.permute, aten.t, aten.mm]
            extern_kernels.mm(reinterpret_tensor(buf2, (8192, 6400), (6400, 1), 0), primals_12, out=buf4)
            del buf2
            del primals_12
            buf6 = empty_strided_cuda((6400, 1600), (1600, 1), torch.bfloat16)
            # Topologically Sorted Source Nodes: [view_21, matmul_4, sigmoid, matmul_5, mul_15, mul_16, mul_17, convert_element_type_32, convert_element_type_33, sub_2, mul_18, mul_19, convert_element_type_34, add_6, view_24, permute_19, mm_11], Original ATen: [aten.view, aten._unsafe_view, aten.sigmoid, aten.mul, aten.sigmoid_backward, aten.add, aten.t, aten.mm]
            extern_kernels.mm(reinterpret_tensor(buf5, (6400, 8192), (1, 6400), 0), view_14, out=buf6)
            del view_14
            buf7 = empty_strided_cuda((8192, 1600), (1600, 1), torch.bfloat16)
            # Topologically Sorted Source Nodes: [view_21, matmul_4, sigmoid, matmul_5, mul_15, mul_16, mul_17, convert_element_type_32, convert_element_type_33, sub_2, mul_18, mul_19, convert_element_type_34, add_6, view_24, getattr_5, permute_21, mm_12], Original ATen: [aten.view, aten._unsafe_view, aten.sigmoid, aten.mul, aten.sigmoid_backward, aten.add, aten.permute, aten.t, aten.mm]
            extern_kernels.mm(reinterpret_tensor(buf5, (8192, 6400), (6400, 1), 0), primals_11, out=buf7)
            del buf5
            del primals_11
            buf11 = empty_strided_cuda((4, 2048, 1600), (3276800, 1600, 1), torch.bfloat16)
            # Topologically Sorted Source Nodes: [view_23, view_25, add_7, convert_element_type_39, matmul_3, x_1, x_2, mul_21, mul_22, mul_23, sum_2, pow_3, mul_24, mul_25, expand, div, pow_4, mul_26, mul_27, add_8, convert_element_type_40, add_9], Original ATen: [aten.view, aten.add, aten._to_copy, aten._unsafe_view, aten.mul, aten.sum, aten.pow, aten.expand, aten.div]
            stream0 = get_raw_stream(0)
            triton_red_fused__to_copy__unsafe_view_add_div_expand_mul_pow_sum_view_1.run(buf4, buf7, primals_10, primals_1, mm_3, tangents_1, rsqrt_1, buf11, 8192, 1600, stream=stream0)
            del primals_10
            del tangents_1
            buf13 = empty_strided_cuda((8192, 1600), (1600, 1), torch.bfloat16)
            # Topologically Sorted Source Nodes: [view_27, getattr_4, permute_25, mm_14], Original ATen: [aten.view, aten.permute, aten.t, aten.mm]
            extern_kernels.mm(reinterpret_tensor(buf11, (8192, 1600), (1600, 1), 0), primals_9, out=buf13)
            del primals_9
            # Topologically Sorted Source Nodes: [view_28, view_29, permute_27, _scaled_dot_product_cudnn_attention_backward], Original ATen: [aten.view, aten.permute, aten._scaled_dot_product_cudnn_attention_backward]
            buf14 = torch.ops.aten._scaled_dot_product_cudnn_attention_backward.default(reinterpret_tensor(buf13, (4, 25, 2048, 64), (3276800, 64, 1600, 1), 0), permute_3, permute_4, permute_5, getitem, getitem_1, getitem_6, getitem_7, None, None, None, 2048, 2048, 0.0, True)
            del getitem_1
            del getitem_6
            del getitem_7
            del permute_3
            del permute_4
            del permute_5
            buf17 = buf14[2]
            assert_size_stride(buf17, (4, 25, 2048, 64), (3276800, 64, 1600, 1), 'torch.ops.aten._scaled_dot_product_cudnn_attention_backward.default')
            assert_alignment(buf17, 16, 'torch.ops.aten._scaled_dot_product_cudnn_attention_backward.default')
            buf21 = buf13; del buf13  # reuse
            # Topologically Sorted Source Nodes: [permute_28, view_32, view_33, getattr_3, permute_33, mm_16], Original ATen: [aten.transpose, aten.view, aten.permute, aten.t, aten.mm]
            extern_kernels.mm(reinterpret_tensor(buf17, (8192, 1600), (1600, 1), 0), primals_5, out=buf21)
            del primals_5
            buf15 = buf14[0]
            assert_size_stride(buf15, (4, 25, 2048, 64), (3276800, 64, 1600, 1), 'torch.ops.aten._scaled_dot_product_cudnn_attention_backward.default')
            assert_alignment(buf15, 16, 'torch.ops.aten._scaled_dot_product_cudnn_attention_backward.default')
            buf16 = buf14[1]
            assert_size_stride(buf16, (4, 25, 2048, 64), (3276800, 64, 1600, 1), 'torch.ops.aten._scaled_dot_product_cudnn_attention_backward.default')
            assert_alignment(buf16, 16, 'torch.ops.aten._scaled_dot_product_cudnn_attention_backward.default')
            del buf14
            buf18 = empty_strided_cuda((4, 2048, 25, 64), (3276800, 1600, 64, 1), torch.bfloat16)
            buf19 = empty_strided_cuda((4, 2048, 25, 64), (3276800, 1600, 64, 1), torch.bfloat16)
            # Topologically Sorted Source Nodes: [permute_29, permute_30, convert_element_type_45, view_30, select, select_1, pos, cos, mul_28, sin, mul_29, neg, mul_30, add_10, mul_31, add_11, convert_element_type_46, full_default, convert_element_type_47, add_12, convert_element_type_48, view_31, select_2, select_3, mul_32, mul_33, neg_1, mul_34, add_13, mul_35, add_14, convert_element_type_49, convert_element_type_50, add_15], Original ATen: [aten.transpose, aten._to_copy, aten.view, aten.select, aten.unsqueeze, aten.index, aten.mul, aten.neg, aten.add, aten.slice_backward]
            stream0 = get_raw_stream(0)
            triton_poi_fused__to_copy_add_index_mul_neg_select_slice_backward_transpose_unsqueeze_view_2.run(buf16, primals_6, primals_7, primals_8, buf15, buf18, buf19, 13107200, stream=stream0)
            del primals_6
            del primals_7
            del primals_8
            buf23 = reinterpret_tensor(buf16, (8192, 1600), (1600, 1), 0); del buf16  # reuse
            # Topologically Sorted Source Nodes: [view_35, view_36, getattr_2, permute_37, mm_18], Original ATen: [aten.view, aten.permute, aten.t, aten.mm]
            extern_kernels.mm(reinterpret_tensor(buf18, (8192, 1600), (1600, 1), 0), primals_4, out=buf23)
            del primals_4
            buf25 = reinterpret_tensor(buf15, (8192, 1600), (1600, 1), 0); del buf15  # reuse
            # Topologically Sorted Source Nodes: [view_38, view_39, getattr_1, permute_41, mm_20], Original ATen: [aten.view, aten.permute, aten.t, aten.mm]
            extern_kernels.mm(reinterpret_tensor(buf19, (8192, 1600), (1600, 1), 0), primals_3, out=buf25)
            del primals_3
            buf29 = empty_strided_cuda((4, 2048, 1600), (3276800, 1600, 1), torch.bfloat16)
            # Call mix order reduction kernel
            # Topologically Sorted Source Nodes: [view_23, view_25, add_7, convert_element_type_39, matmul_3, x_1, x_2, mul_10, mul_20, sum_1, view_34, view_37, add_16, view_40, add_17, convert_element_type_63, x, mul, mul_36, mul_37, sum_3, mul_38, mul_39, sum_4, pow_5, mul_40, mul_41, expand_1, div_1, pow_6, mul_42, mul_43, add_18, convert_element_type_64, add_19], Original ATen: [aten.view, aten.add, aten._to_copy, aten._unsafe_view, aten.mul, aten.sum, aten.pow, aten.expand, aten.div]
            workspace_0 = empty_strided_cuda((1638400, ), (1, ), torch.float32)
            stream0 = get_raw_stream(0)
            triton_per_fused__to_copy__unsafe_view_add_div_expand_mul_pow_sum_view_3.run(buf21, buf23, buf25, primals_2, primals_1, buf11, rsqrt, buf4, buf7, mm_3, rsqrt_1, buf29, workspace_0, 8192, 1600, stream=stream0)
            buf9 = workspace_0[0 * 512 * 1600 : (0 + 1) * 512 * 1600].view(512, 1600).sum(dim=0)
            buf27 = workspace_0[1 * 512 * 1600 : (1 + 1) * 512 * 1600].view(512, 1600).sum(dim=0)
            del workspace_0
            del buf21
            del buf23
            del buf25
            del buf4
            del buf7
            del mm_3
            del primals_1
            del primals_2
            del rsqrt
            del rsqrt_1
            buf12 = empty_strided_cuda((1600, 1600), (1600, 1), torch.bfloat16)
            # Topologically Sorted Source Nodes: [view_27, permute_23, rearrange, matmul_3, mm_13], Original ATen: [aten.view, aten.t, aten.permute, aten.mm]
            extern_kernels.mm(reinterpret_tensor(buf11, (1600, 8192), (1, 1600), 0), reinterpret_tensor(getitem, (8192, 1600), (1600, 1), 0), out=buf12)
            del buf11
            del getitem
            buf20 = empty_strided_cuda((1600, 1600), (1600, 1), torch.bfloat16)
            # Topologically Sorted Source Nodes: [permute_28, view_32, view_33, permute_31, mm_15], Original ATen: [aten.transpose, aten.view, aten.t, aten.mm]
            extern_kernels.mm(reinterpret_tensor(buf17, (1600, 8192), (1, 1600), 0), view, out=buf20)
            del buf17
            buf22 = empty_strided_cuda((1600, 1600), (1600, 1), torch.bfloat16)
            # Topologically Sorted Source Nodes: [view_35, view_36, permute_35, mm_17], Original ATen: [aten.view, aten.t, aten.mm]
            extern_kernels.mm(reinterpret_tensor(buf18, (1600, 8192), (1, 1600), 0), view, out=buf22)
            del buf18
            buf24 = empty_strided_cuda((1600, 1600), (1600, 1), torch.bfloat16)
            # Topologically Sorted Source Nodes: [view_38, view_39, permute_39, mm_19], Original ATen: [aten.view, aten.t, aten.mm]
            extern_kernels.mm(reinterpret_tensor(buf19, (1600, 8192), (1, 1600), 0), view, out=buf24)
            del buf19
            del view
        return (buf29, reinterpret_tensor(buf27, (1600, ), (1, ), 0), buf24, buf22, buf20, None, None, None, buf12, reinterpret_tensor(buf9, (1600, ), (1, ), 0), buf6, buf3, buf0, )

runner = Runner(partitions=[])
call = runner.call
recursively_apply_fns = runner.recursively_apply_fns


def get_args():
    from torch._dynamo.testing import rand_strided
    primals_1 = rand_strided((4, 2048, 1600), (3276800, 1600, 1), device='cuda:0', dtype=torch.bfloat16)
    primals_2 = rand_strided((1600, ), (1, ), device='cuda:0', dtype=torch.float32)
    primals_3 = rand_strided((1600, 1600), (1600, 1), device='cuda:0', dtype=torch.bfloat16)
    primals_4 = rand_strided((1600, 1600), (1600, 1), device='cuda:0', dtype=torch.bfloat16)
    primals_5 = rand_strided((1600, 1600), (1600, 1), device='cuda:0', dtype=torch.bfloat16)
    primals_6 = rand_strided((2048, ), (1, ), device='cuda:0', dtype=torch.int64)
    primals_7 = rand_strided((2048, 32), (32, 1), device='cuda:0', dtype=torch.float32)
    primals_8 = rand_strided((2048, 32), (32, 1), device='cuda:0', dtype=torch.float32)
    primals_9 = rand_strided((1600, 1600), (1600, 1), device='cuda:0', dtype=torch.bfloat16)
    primals_10 = rand_strided((1600, ), (1, ), device='cuda:0', dtype=torch.float32)
    primals_11 = rand_strided((6400, 1600), (1600, 1), device='cuda:0', dtype=torch.bfloat16)
    primals_12 = rand_strided((6400, 1600), (1600, 1), device='cuda:0', dtype=torch.bfloat16)
    primals_13 = rand_strided((1600, 6400), (6400, 1), device='cuda:0', dtype=torch.bfloat16)
    rsqrt = rand_strided((4, 2048, 1), (2048, 1, 1), device='cuda:0', dtype=torch.float32)
    view = rand_strided((8192, 1600), (1600, 1), device='cuda:0', dtype=torch.bfloat16)
    permute_3 = rand_strided((4, 25, 2048, 64), (3276800, 64, 1600, 1), device='cuda:0', dtype=torch.bfloat16)
    permute_4 = rand_strided((4, 25, 2048, 64), (3276800, 64, 1600, 1), device='cuda:0', dtype=torch.bfloat16)
    permute_5 = rand_strided((4, 25, 2048, 64), (3276800, 64, 1600, 1), device='cuda:0', dtype=torch.bfloat16)
    getitem = rand_strided((4, 25, 2048, 64), (3276800, 64, 1600, 1), device='cuda:0', dtype=torch.bfloat16)
    getitem_1 = rand_strided((4, 25, 2048, 1), (51200, 2048, 1, 1), device='cuda:0', dtype=torch.float32)
    getitem_6 = rand_strided((), (), device='cuda:0', dtype=torch.int64)
    getitem_7 = rand_strided((), (), device='cuda:0', dtype=torch.int64)
    mm_3 = rand_strided((8192, 1600), (1600, 1), device='cuda:0', dtype=torch.bfloat16)
    rsqrt_1 = rand_strided((4, 2048, 1), (2048, 1, 1), device='cuda:0', dtype=torch.float32)
    view_14 = rand_strided((8192, 1600), (1600, 1), device='cuda:0', dtype=torch.bfloat16)
    mm_4 = rand_strided((8192, 6400), (6400, 1), device='cuda:0', dtype=torch.bfloat16)
    mm_5 = rand_strided((8192, 6400), (6400, 1), device='cuda:0', dtype=torch.bfloat16)
    view_18 = rand_strided((8192, 6400), (6400, 1), device='cuda:0', dtype=torch.bfloat16)
    tangents_1 = rand_strided((4, 2048, 1600), (3276800, 1600, 1), device='cuda:0', dtype=torch.bfloat16)
    return [primals_1, primals_2, primals_3, primals_4, primals_5, primals_6, primals_7, primals_8, primals_9, primals_10, primals_11, primals_12, primals_13, rsqrt, view, permute_3, permute_4, permute_5, getitem, getitem_1, getitem_6, getitem_7, mm_3, rsqrt_1, view_14, mm_4, mm_5, view_18, tangents_1]


def benchmark_compiled_module(args, times=10, repeat=10):
    from torch._inductor.utils import print_performance
    fn = lambda: call(list(args))
    return print_performance(fn, times=times, repeat=repeat)


if __name__ == "__main__":
    from torch._inductor.wrapper_benchmark import compiled_module_main
    args = get_args()
    compiled_module_main('None', lambda times, repeat: benchmark_compiled_module(args, times=times, repeat=repeat))

Output code written to: /tmp/torchinductor_root/wx/cwx5756pd23czq3zs425dlbduiezniixqqb6fjwa5wibo32fzopx.py
Output code written to: /tmp/torchinductor_root/wx/cwx5756pd23czq3zs425dlbduiezniixqqb6fjwa5wibo32fzopx.py
