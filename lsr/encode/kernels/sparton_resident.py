"""Sparton forward for Hopper (sm_90) with the vocabulary tile resident on chip (Gluon).

Why: the tl kernel (sparton.py) streams both operands of every [BLOCK_V, BLOCK_S] tile through L2, ~85 FLOP per byte
at its best tile, and at 64x512x250002 it sits on L2 bandwidth (docs/notes-sparton.md, sessions 25-26). Here one
program owns a 128-row vocabulary tile and keeps its E rows on chip for the whole batch: 10 K slices in shared memory,
2 in registers (wgmma's A operand may come from registers, which frees shared memory for a 4-deep ring of hidden
slices). Every hidden row streams past through TMA, so each streamed byte feeds 128 FLOP.

Per 128-position chunk the fold takes the max, then the first column equal to it (cheaper than a (value, index)
reduction), and masks only a row's last, partial chunk. The result is bit-identical to the tl kernel: the same MMA
shape along K in the same order, the same masked max and first-index argmax (tests/test_sparton_resident.py).

Scope: bf16/fp16, D a multiple of 64 with the tile fitting shared memory (D <= 768), and only rows whose kept positions
are 0..len-1: the launcher sends rows with holes to the tl kernel. The chunk table is built on the device (no host
sync). Torch twin: ``sparton.torch_sparton_head``. Gluon has no CPU interpreter: the kernel's parity tests need a GPU;
the chunk table's run on the CPU.
"""
from __future__ import annotations

import torch

try:  # Gluon ships with triton >= 3.5; its API is experimental, so any import problem means "not available"
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from lsr.encode.kernels.sparton import store_head_row  # a tl function: Gluon kernels may call those
except Exception:  # noqa: BLE001 - pragma: no cover (older triton, no triton)
    gluon = None

BLOCK_V = 128  # vocabulary rows per program (two warpgroups of 64)
BLOCK_S = 128  # hidden rows per chunk
BLOCK_K = 64  # K slice of one ring stage / one resident slice
REG_K = 2  # K slices of the E tile held in registers (the kernel has exactly two: e_reg0, e_reg1)
STAGES = 4
SMEM_BYTES = 227 * 1024  # sm_90's opt-in shared memory per block


if gluon is not None:

    @gluon.jit
    def _resident_fwd_kernel(
        e_desc, h_desc, chunk_ptr, n_chunks_ptr, len_ptr, bias_ptr, y_ptr, y32_ptr, arg_ptr,
        S, V, stride_y,
        HAS_BIAS: gl.constexpr, STORE_FP32: gl.constexpr, STORE_ARGMAX: gl.constexpr,
        NUM_K: gl.constexpr, REG_K: gl.constexpr, STAGES: gl.constexpr, num_warps: gl.constexpr,
    ):
        gl.static_assert(REG_K == 2)
        BV: gl.constexpr = e_desc.block_type.shape[0]
        BS: gl.constexpr = h_desc.block_type.shape[0]
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                      instr_shape=[16, BS, 16])
        v0 = gl.program_id(0) * BV
        e_smem = gl.allocate_shared_memory(e_desc.dtype, [NUM_K - REG_K, BV, e_desc.block_type.shape[1]], e_desc.layout)
        h_smem = gl.allocate_shared_memory(h_desc.dtype, [STAGES, BS, h_desc.block_type.shape[1]], h_desc.layout)
        e_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(e_bar, count=1)
        for st in gl.static_range(STAGES):
            mbarrier.init(ready.index(st), count=1)
        fence_async_shared()
        e_reg0, e_reg1 = _stage_e_tile(e_desc, e_smem, h_smem, e_bar, v0, NUM_K, REG_K, mma)
        n_chunks = gl.load(n_chunks_ptr)
        row = gl.load(chunk_ptr)  # -1 when there is no chunk
        for st in gl.static_range(STAGES - 1):  # ring prologue: the first chunk's first K slices
            _load_slice(h_desc, h_smem, ready, 0, row, -1, st, NUM_K, STAGES)
        offs_v = v0 + gl.arange(0, BV, gl.SliceLayout(1, mma))
        v_ok = offs_v < V
        offs_s = gl.arange(0, BS, gl.SliceLayout(0, mma))
        run_max = gl.full([BV], float("-inf"), gl.float32, gl.SliceLayout(1, mma))
        run_arg = gl.zeros([BV], gl.int32, gl.SliceLayout(1, mma))
        acc = gl.zeros([BV, BS], gl.float32, mma)
        for c in range(n_chunks):
            nxt = gl.load(chunk_ptr + c + 1, mask=c + 1 < n_chunks, other=-1)
            for k in gl.static_range(NUM_K):
                i = c * NUM_K + k
                mbarrier.wait(ready.index(i % STAGES), (i // STAGES) & 1)
                if k == 0:
                    a = e_reg0
                elif k == 1:
                    a = e_reg1
                else:
                    a = e_smem.index(k - REG_K)
                acc = warpgroup_mma(a, h_smem.index(i % STAGES).permute((1, 0)), acc, use_acc=k > 0, is_async=True)
                acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
                # step i-1's MMA is done, so its slot takes step i + STAGES - 1
                _load_slice(h_desc, h_smem, ready, c, row, nxt, k + STAGES - 1, NUM_K, STAGES)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            run_max, run_arg = _fold(acc, row, run_max, run_arg, len_ptr, S, offs_s, STORE_ARGMAX)
            if (nxt < 0) | (nxt // S != row // S):  # the batch row's last chunk
                store_head_row(run_max, run_arg, offs_v, v_ok, row // S, bias_ptr, y_ptr, y32_ptr, arg_ptr, stride_y,
                               HAS_BIAS, STORE_FP32, STORE_ARGMAX)
                run_max = gl.full_like(run_max, float("-inf"))
                run_arg = gl.zeros_like(run_arg)
            row = nxt
        mbarrier.invalidate(e_bar)
        for st in gl.static_range(STAGES):
            mbarrier.invalidate(ready.index(st))

    @gluon.jit
    def _stage_e_tile(e_desc, e_smem, h_smem, e_bar, v0, NUM_K: gl.constexpr, REG_K: gl.constexpr, mma: gl.constexpr):
        """TMA the program's E tile on chip: slices REG_K.. into ``e_smem``; slices 0 and 1 (REG_K = 2) through the ring's first two
        slots into registers (returned), after which the slots are free for the ring."""
        BK: gl.constexpr = e_desc.block_type.shape[1]
        mbarrier.expect(e_bar, NUM_K * e_desc.block_type.nbytes)
        for k in gl.static_range(NUM_K):
            if k < REG_K:
                tma.async_copy_global_to_shared(e_desc, [v0, k * BK], e_bar, h_smem.index(k))
            else:
                tma.async_copy_global_to_shared(e_desc, [v0, k * BK], e_bar, e_smem.index(k - REG_K))
        mbarrier.wait(e_bar, 0)
        a_regs: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
        e_reg0 = h_smem.index(0).load(a_regs)
        e_reg1 = h_smem.index(1).load(a_regs)
        gl.thread_barrier()  # every warp has read the slots before the ring's TMA writes them
        fence_async_shared()
        return e_reg0, e_reg1

    @gluon.jit
    def _load_slice(h_desc, h_smem, ready, c, row, nxt, AHEAD: gl.constexpr, NUM_K: gl.constexpr,
                    STAGES: gl.constexpr):
        """TMA of ring step c·NUM_K + AHEAD: K slice AHEAD of chunk c (first hidden row ``row``), or of the next chunk
        (``nxt``) when AHEAD >= NUM_K; a row of -1 (no such chunk) skips the load."""
        BK: gl.constexpr = h_desc.block_type.shape[1]
        j = c * NUM_K + AHEAD
        if AHEAD < NUM_K:
            jrow = row
        else:
            jrow = nxt
        mbarrier.expect(ready.index(j % STAGES), h_desc.block_type.nbytes, pred=jrow >= 0)
        tma.async_copy_global_to_shared(h_desc, [jrow, (AHEAD % NUM_K) * BK], ready.index(j % STAGES),
                                        h_smem.index(j % STAGES), pred=jrow >= 0)

    @gluon.jit
    def _fold(acc, row, run_max, run_arg, len_ptr, S, offs_s, STORE_ARGMAX: gl.constexpr):
        """Fold the chunk whose first hidden row is ``row`` into the running max (and first argmax) over s."""
        BS: gl.constexpr = acc.shape[1]
        b = row // S
        s0 = row - b * S
        n_s = gl.load(len_ptr + b)
        if s0 + BS <= n_s:  # a full chunk: nothing to mask (the select costs a pass over the tile)
            masked = acc
        else:
            masked = gl.where(gl.expand_dims(s0 + offs_s < n_s, 0), acc, float("-inf"))
        t_max = gl.max(masked, axis=1)
        if STORE_ARGMAX:  # the first column holding the max: tl.max(return_indices=True)'s answer
            hit = masked == gl.expand_dims(t_max, 1)
            t_arg = gl.min(gl.where(hit, gl.expand_dims(offs_s, 0), BS), axis=1)
            better = t_max > run_max  # strict: an earlier chunk keeps a tie
            run_max = gl.where(better, t_max, run_max)
            run_arg = gl.where(better, t_arg + s0, run_arg)
        else:
            run_max = gl.maximum(run_max, t_max)
        return run_max, run_arg


def resident_applies(hidden: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether this kernel can run these inputs: an sm_90 GPU, bf16/fp16, 16-byte aligned, D a multiple of BLOCK_K
    with the on-chip E tile and the ring fitting shared memory."""
    if gluon is None or hidden.device.type != "cuda" or torch.cuda.get_device_capability(hidden.device) != (9, 0):
        return False
    if hidden.dtype not in (torch.bfloat16, torch.float16) or hidden.data_ptr() % 16 or weight.data_ptr() % 16:
        return False
    D = hidden.shape[-1]
    slice_bytes = BLOCK_V * BLOCK_K * hidden.element_size()
    return D % BLOCK_K == 0 and D // BLOCK_K > REG_K and \
        (D // BLOCK_K - REG_K + STAGES) * slice_bytes + 1024 <= SMEM_BYTES


def chunk_table(lengths: torch.Tensor, rows_ok: torch.Tensor, S: int, block_s: int = BLOCK_S
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """First hidden rows (b·S + s0) of the S chunks of every batch row with ``rows_ok``, in batch order, padded with
    -1 (int32 [B·ceil(S / block_s) + 1]), and their count (int32 [1]); both built on the device without a sync. A
    row of length 0 gets one chunk, so its outputs are written too (0, argmax 0)."""
    B = lengths.shape[0]
    per_row = torch.where(rows_ok, torch.clamp((lengths + block_s - 1) // block_s, min=1), 0)
    width = max(1, -(-S // block_s))
    starts = torch.cumsum(per_row, 0) - per_row
    idx = torch.arange(width, device=lengths.device)
    valid = idx[None, :] < per_row[:, None]
    rows = torch.arange(B, device=lengths.device)[:, None] * S + idx[None, :] * block_s
    table = torch.full((B * width + 1,), -1, dtype=torch.int32, device=lengths.device)
    dump = B * width  # invalid positions all write here, then it is reset to the end marker
    table.scatter_(0, torch.where(valid, starts[:, None] + idx[None, :], dump).view(-1), rows.to(torch.int32).view(-1))
    table[dump] = -1
    return table, per_row.sum().to(torch.int32).view(1)


def resident_fwd(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, lengths: torch.Tensor,
                 rows_ok: torch.Tensor, y: torch.Tensor, y32: torch.Tensor | None, arg: torch.Tensor | None) -> None:
    """Write y / y32 / arg [B, V] of the batch rows with ``rows_ok`` (kept positions exactly 0..len-1); the other rows
    are left as they are. Inputs contiguous, ``resident_applies`` true."""
    B, S, D = hidden.shape
    V = weight.shape[0]
    gdt = gl.bfloat16 if hidden.dtype == torch.bfloat16 else gl.float16
    e_desc = TensorDescriptor.from_tensor(weight, [BLOCK_V, BLOCK_K],
                                          gl.NVMMASharedLayout.get_default_for([BLOCK_V, BLOCK_K], gdt))
    h_desc = TensorDescriptor.from_tensor(hidden.view(B * S, D), [BLOCK_S, BLOCK_K],
                                          gl.NVMMASharedLayout.get_default_for([BLOCK_S, BLOCK_K], gdt))
    table, n_chunks = chunk_table(lengths, rows_ok, S)
    _resident_fwd_kernel[(-(-V // BLOCK_V),)](
        e_desc, h_desc, table, n_chunks, lengths, bias if bias is not None else y, y,
        y32 if y32 is not None else y, arg if arg is not None else lengths, S, V, y.stride(0),
        HAS_BIAS=bias is not None, STORE_FP32=y32 is not None, STORE_ARGMAX=arg is not None,
        NUM_K=D // BLOCK_K, REG_K=REG_K, STAGES=STAGES, num_warps=8)
