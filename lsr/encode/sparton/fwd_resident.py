"""Sparton forward for Hopper (sm_90) with the vocabulary tile resident on chip (Gluon). **Experimental**: Gluon's
API is experimental in triton, so the dispatch (``dispatch.SpartonDispatch``) falls back to the tl kernel, and remembers
to, if this kernel fails to compile; ``variant="padded"`` keeps it off.

Why: the tl kernel (``fwd_padded``) streams both operands of every [BLOCK_V, BLOCK_S] tile through L2, ~85 FLOP per
byte at its best tile, and at 64x512x250002 it sits on L2 bandwidth (docs/performance/head.md). Here one program owns a
128-row vocabulary tile and keeps its E rows on chip for the whole batch: 10 K slices in shared memory, 2 in registers
(wgmma's A operand may come from registers, which frees shared memory for a ring of hidden slices, 4 deep at D = 768).
Every hidden row streams past through TMA, so each streamed byte feeds 128 FLOP.

The work is warp-specialized: a producer warp streams the hidden chunks' K slices through the ring, and two consumer
warpgroups, each multiplying all 128 rows, take turns chunk by chunk. The chunk table interleaves two batch rows, one
per consumer, so one consumer folds its chunk into the row's running max / argmax while the other's MMAs run (in a
single warpgroup the fold left the tensor cores idle; ptxas would not overlap it with wgmma there,
docs/performance/head.md). A consumer hands the turn over as soon as its chunk's last MMA is issued.

Per chunk the fold takes the max, then the first column equal to it (cheaper than a (value, index) reduction), and
masks only a row's last, partial chunk. The result is bit-identical to the tl kernel: the same MMA shape along K in the
same order, the same masked max and first-index argmax, the same epilogue (``epilogue.store_head_row``;
tests/encode/test_sparton_resident.py).

Scope (``unsupported_reason`` says which part fails): an sm_90 GPU; bf16/fp16; 16-byte aligned operands; D a multiple
of 64 whose tile fits shared memory beside a ring of at least two slots whose depth divides D / 64 (``ring_stages``:
192-640, 768 and 896 of the widths up to 1024); only rows whose kept positions are 0..len-1: the padded launcher sends
rows with holes to the tl kernel. The chunk table is built on the device (no host sync). Torch twin:
``reference.torch_sparton_head``. Gluon has no CPU interpreter: the kernel's parity tests need a GPU; the chunk table's
run on the CPU.
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

    from lsr.encode.sparton.epilogue import store_head_row  # a tl function: Gluon kernels may call those
except Exception:  # noqa: BLE001 - pragma: no cover (older triton, no triton)
    gluon = None

BLOCK_V = 128  # vocabulary rows per program (both consumer warpgroups multiply all of them)
BLOCK_S = 128  # hidden rows per chunk
BLOCK_K = 64  # K slice of one ring stage / one resident slice
REG_K = 2  # K slices of the E tile each consumer holds in registers (the kernel has exactly two: e_reg0, e_reg1)
MAX_STAGES = 8
SMEM_BYTES = 227 * 1024  # sm_90's opt-in shared memory per block
# registers: 12 warps (two consumer warpgroups, one producer warp rounded up to a warpgroup) at launch share the
# register file (65536 / 384 -> 168); the producer gives all but 24 back and each consumer takes 240
MAXNREG, CONSUMER_REGS, PRODUCER_REGS = 168, 240, 24


if gluon is not None:

    @gluon.jit
    def _resident_fwd_kernel(
        e_desc, h_desc, chunk_ptr, info_ptr, n_chunks_ptr, len_ptr, bias_ptr, y_ptr, y32_ptr, arg_ptr,
        S, V, stride_y,
        HAS_BIAS: gl.constexpr, STORE_FP32: gl.constexpr, STORE_ARGMAX: gl.constexpr,
        NUM_K: gl.constexpr, REG_K: gl.constexpr, STAGES: gl.constexpr, CONSUMER_REGS: gl.constexpr,
        PRODUCER_REGS: gl.constexpr,
    ):
        """One program per BV-row vocabulary tile: the E tile on chip, hidden chunks streaming through a TMA ring
        (producer warp), two consumer warpgroups taking turns chunk by chunk (see ``chunk_table``)."""
        gl.static_assert(REG_K == 2)
        gl.static_assert(NUM_K % STAGES == 0)  # so step k of any chunk sits in ring slot k % STAGES
        gl.static_assert(STAGES >= REG_K)  # the register slices arrive through the first REG_K slots
        BV: gl.constexpr = e_desc.block_type.shape[0]
        BK: gl.constexpr = e_desc.block_type.shape[1]
        v0 = gl.program_id(0) * BV
        e_smem = gl.allocate_shared_memory(e_desc.dtype, [NUM_K - REG_K, BV, BK], e_desc.layout)
        h_smem = gl.allocate_shared_memory(h_desc.dtype, [STAGES, h_desc.block_type.shape[0], BK], h_desc.layout)
        bars = gl.allocate_shared_memory(gl.int64, [2 * STAGES + 4, 1], mbarrier.MBarrierLayout())
        # bars: ready[STAGES] (a slice landed), empty[STAGES] (a slice was used), turn[2] (a consumer's turn to
        # issue MMAs), e_bar (the E tile landed), regs_done (both consumers hold the register slices)
        for i in gl.static_range(2 * STAGES + 3):
            mbarrier.init(bars.index(i), count=1)
        mbarrier.init(bars.index(2 * STAGES + 3), count=2)
        fence_async_shared()
        e_bar = bars.index(2 * STAGES + 2)
        mbarrier.expect(e_bar, NUM_K * e_desc.block_type.nbytes)
        for k in gl.static_range(NUM_K):  # slices 0 and 1 through ring slots 0 and 1, on their way to registers
            if k < REG_K:
                tma.async_copy_global_to_shared(e_desc, [v0, k * BK], e_bar, h_smem.index(k))
            else:
                tma.async_copy_global_to_shared(e_desc, [v0, k * BK], e_bar, e_smem.index(k - REG_K))
        gl.warp_specialize([
            (_consume, (e_smem, h_smem, bars, chunk_ptr, info_ptr, n_chunks_ptr, len_ptr, bias_ptr, y_ptr, y32_ptr,
                        arg_ptr, S, V, stride_y, v0, HAS_BIAS, STORE_FP32, STORE_ARGMAX, NUM_K, REG_K, STAGES, 0)),
            (_consume, (e_smem, h_smem, bars, chunk_ptr, info_ptr, n_chunks_ptr, len_ptr, bias_ptr, y_ptr, y32_ptr,
                        arg_ptr, S, V, stride_y, v0, HAS_BIAS, STORE_FP32, STORE_ARGMAX, NUM_K, REG_K, STAGES, 1)),
            (_produce, (h_desc, h_smem, bars, chunk_ptr, n_chunks_ptr, NUM_K, STAGES)),
        ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])

    @gluon.jit
    def _produce(h_desc, h_smem, bars, chunk_ptr, n_chunks_ptr, NUM_K: gl.constexpr, STAGES: gl.constexpr):
        """The producer warp: every K slice of every chunk, in table order, into the ring."""
        BK: gl.constexpr = h_desc.block_type.shape[1]
        n_chunks = gl.load(n_chunks_ptr)
        mbarrier.wait(bars.index(2 * STAGES + 3), 0)  # slots 0 and 1 carried E slices until both consumers had them
        for c in range(n_chunks):
            row = gl.load(chunk_ptr + c)
            ph0 = (c * (NUM_K // STAGES)) & 1
            for k in gl.static_range(NUM_K):  # fresh barriers pass the first wait on `empty`
                mbarrier.wait(bars.index(STAGES + k % STAGES), ph0 ^ ((k // STAGES) & 1) ^ 1)
                mbarrier.expect(bars.index(k % STAGES), h_desc.block_type.nbytes)
                tma.async_copy_global_to_shared(h_desc, [row, k * BK], bars.index(k % STAGES), h_smem.index(k % STAGES))

    @gluon.jit
    def _consume(e_smem, h_smem, bars, chunk_ptr, info_ptr, n_chunks_ptr, len_ptr, bias_ptr, y_ptr, y32_ptr, arg_ptr,
                 S, V, stride_y, v0, HAS_BIAS: gl.constexpr, STORE_FP32: gl.constexpr, STORE_ARGMAX: gl.constexpr,
                 NUM_K: gl.constexpr, REG_K: gl.constexpr, STAGES: gl.constexpr, ME: gl.constexpr):
        """Consumer warpgroup ME: the chunks whose owner bit is ME (whole batch rows), each folded into the row's
        running max / argmax while the other consumer's MMAs run; the row's outputs at its last chunk."""
        BV: gl.constexpr = e_smem.shape[1]
        BS: gl.constexpr = h_smem.shape[1]
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BS, 16])
        a_regs: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
        mbarrier.wait(bars.index(2 * STAGES + 2), 0)
        e_reg0 = h_smem.index(0).load(a_regs)
        e_reg1 = h_smem.index(1).load(a_regs)
        fence_async_shared()  # generic-proxy reads before the producer's TMA writes to the slots
        gl.thread_barrier()  # all four warps have read them
        mbarrier.arrive(bars.index(2 * STAGES + 3), count=1)
        n_chunks = gl.load(n_chunks_ptr)
        offs_v = v0 + gl.arange(0, BV, gl.SliceLayout(1, mma))
        v_ok = offs_v < V
        offs_s = gl.arange(0, BS, gl.SliceLayout(0, mma))
        run_max = gl.full([BV], float("-inf"), gl.float32, gl.SliceLayout(1, mma))
        run_arg = gl.zeros([BV], gl.int32, gl.SliceLayout(1, mma))
        turns = 0
        info = gl.load(info_ptr)
        for c in range(n_chunks):
            nxt = gl.load(info_ptr + c + 1, mask=c + 1 < n_chunks, other=ME)
            if (info & 1) == ME:
                if ((info >> 2) & 1) != ME:  # the other consumer ran the chunk before: wait for its last MMA issue
                    mbarrier.wait(bars.index(2 * STAGES + ME), turns & 1)
                    turns += 1
                row = gl.load(chunk_ptr + c)
                acc = _chunk_mmas(e_reg0, e_reg1, e_smem, h_smem, bars, c, mma, NUM_K, REG_K, STAGES)
                if (nxt & 1) != ME:  # hand the tensor cores over before our fold: its MMAs queue behind ours
                    mbarrier.arrive(bars.index(2 * STAGES + 1 - ME), count=1)
                acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
                mbarrier.arrive(bars.index(STAGES + (NUM_K - 1) % STAGES), count=1)
                run_max, run_arg = _fold(acc, row, run_max, run_arg, len_ptr, S, offs_s, STORE_ARGMAX)
                if (info & 2) != 0:  # the batch row's last chunk
                    store_head_row(run_max, run_arg, offs_v, v_ok, row // S, bias_ptr, y_ptr, y32_ptr, arg_ptr,
                                   stride_y, HAS_BIAS, STORE_FP32, STORE_ARGMAX)
                    run_max = gl.full_like(run_max, float("-inf"))
                    run_arg = gl.zeros_like(run_arg)
            info = nxt

    @gluon.jit
    def _chunk_mmas(e_reg0, e_reg1, e_smem, h_smem, bars, c, mma: gl.constexpr, NUM_K: gl.constexpr,
                    REG_K: gl.constexpr, STAGES: gl.constexpr):
        """Issue chunk c's MMAs over all K slices, releasing each ring slot once its MMA is done; the last MMA is
        left in flight (the caller waits for it)."""
        BV: gl.constexpr = e_smem.shape[1]
        BS: gl.constexpr = h_smem.shape[1]
        ph0 = (c * (NUM_K // STAGES)) & 1
        acc = gl.zeros([BV, BS], gl.float32, mma)  # the first MMA does not read it
        mbarrier.wait(bars.index(0), ph0)  # steps 0 and 1 sit in slots 0 and 1 of the chunk's first ring lap
        acc = warpgroup_mma(e_reg0, h_smem.index(0).permute((1, 0)), acc, use_acc=False, is_async=True)
        mbarrier.wait(bars.index(1), ph0)
        acc = warpgroup_mma(e_reg1, h_smem.index(1).permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
        mbarrier.arrive(bars.index(STAGES), count=1)
        # a loop, not unrolled: unrolled, the shared-memory descriptors of all steps stay live and spill
        for k in range(REG_K, NUM_K):
            slot = k % STAGES
            mbarrier.wait(bars.index(slot), ph0 ^ ((k // STAGES) & 1))
            acc = warpgroup_mma(e_smem.index(k - REG_K), h_smem.index(slot).permute((1, 0)), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
            mbarrier.arrive(bars.index(STAGES + (k + STAGES - 1) % STAGES), count=1)
        return acc

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


def ring_stages(num_k: int, element_size: int) -> int:
    """Ring depth for NUM_K slices of the E tile: the deepest ring that divides NUM_K (so a chunk's step k always
    sits in slot k % STAGES) and fits shared memory beside the resident slices; 0 if none of at least 2 does."""
    slice_bytes = BLOCK_V * BLOCK_K * element_size
    fits = [st for st in range(2, min(num_k, MAX_STAGES) + 1)
            if num_k % st == 0 and (num_k - REG_K + st) * slice_bytes + 1024 <= SMEM_BYTES]
    return max(fits, default=0)


def unsupported_reason(capability: tuple[int, int] | None, dtype: torch.dtype, width: int, aligned: bool) -> str | None:
    """Why this kernel cannot run inputs of ``dtype`` and hidden width ``width`` on a GPU of compute ``capability``
    (None: not a CUDA device) with operands 16-byte aligned or not; None when it can."""
    if gluon is None:
        return "triton's Gluon is not available"
    if capability != (9, 0):
        return "needs an sm_90 GPU (H100/H200)" if capability is None else f"needs sm_90, the GPU is sm_{capability[0]}{capability[1]}"
    if dtype not in (torch.bfloat16, torch.float16):
        return f"needs bf16/fp16, got {str(dtype).removeprefix('torch.')}"
    if not aligned:
        return "needs 16-byte aligned hidden states and weight"
    if width % BLOCK_K or width // BLOCK_K <= REG_K or ring_stages(width // BLOCK_K, dtype.itemsize) == 0:
        return f"hidden width {width} does not fit (a multiple of {BLOCK_K} whose tile and ring fit shared memory)"
    return None


def chunk_table(lengths: torch.Tensor, rows_ok: torch.Tensor, S: int, block_s: int = BLOCK_S
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The chunks of every batch row with ``rows_ok``, built on the device without a sync: (first hidden rows
    b·S + s0, int32 [B·ceil(S / block_s) + 1] padded with -1; info, int32, same size; count, int32 [1]).

    The ok rows are taken in pairs and the two rows' chunks interleaved (row 2p's first chunk, row 2p+1's first
    chunk, row 2p's second, ...), so the consumer owning row 2p (consumer 0) folds while the other one's MMAs run.
    info = owner | (last chunk of its row) << 1 | (owner of the chunk before) << 2. A row of length 0 gets one
    chunk, so its outputs are written too (0, argmax 0)."""
    B = lengths.shape[0]
    dev = lengths.device
    per_row = torch.where(rows_ok, torch.clamp((lengths + block_s - 1) // block_s, min=1), 0).long()
    width = max(1, -(-S // block_s))
    rank = torch.cumsum(rows_ok.long(), 0) - 1
    owner = (rank % 2)[:, None].expand(B, width)
    idx = torch.arange(width, device=dev)
    valid = idx[None, :] < per_row[:, None]
    key = torch.where(valid, ((rank // 2)[:, None] * width + idx[None, :]) * 2 + owner, torch.iinfo(torch.int64).max)
    order = torch.sort(key.view(-1)).indices
    ok = valid.reshape(-1)[order]
    own = owner.reshape(-1)[order]
    last = (idx[None, :] == per_row[:, None] - 1).reshape(-1)[order].long()
    before = torch.cat([own[:1], own[:-1]])
    rows = (torch.arange(B, device=dev)[:, None] * S + idx[None, :] * block_s).reshape(-1)[order]
    end = torch.full((1,), -1, dtype=torch.int64, device=dev)  # a fill kernel, not a host copy: no sync
    table = torch.cat([torch.where(ok, rows, -1), end]).to(torch.int32)
    info = torch.cat([torch.where(ok, own | last << 1 | before << 2, 0), end + 1]).to(torch.int32)
    return table, info, per_row.sum().to(torch.int32).view(1)


def resident_fwd(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, lengths: torch.Tensor,
                 rows_ok: torch.Tensor, y: torch.Tensor, y32: torch.Tensor | None, arg: torch.Tensor | None) -> None:
    """Write y / y32 / arg [B, V] of the batch rows with ``rows_ok`` (kept positions exactly 0..len-1); the other rows
    are left as they are. Inputs contiguous, ``unsupported_reason`` None for them."""
    B, S, D = hidden.shape
    V = weight.shape[0]
    gdt = gl.bfloat16 if hidden.dtype == torch.bfloat16 else gl.float16
    e_desc = TensorDescriptor.from_tensor(weight, [BLOCK_V, BLOCK_K],
                                          gl.NVMMASharedLayout.get_default_for([BLOCK_V, BLOCK_K], gdt))
    h_desc = TensorDescriptor.from_tensor(hidden.view(B * S, D), [BLOCK_S, BLOCK_K],
                                          gl.NVMMASharedLayout.get_default_for([BLOCK_S, BLOCK_K], gdt))
    table, info, n_chunks = chunk_table(lengths, rows_ok, S)
    _resident_fwd_kernel[(-(-V // BLOCK_V),)](
        e_desc, h_desc, table, info, n_chunks, lengths, bias if bias is not None else y, y,
        y32 if y32 is not None else y, arg if arg is not None else lengths, S, V, y.stride(0),
        HAS_BIAS=bias is not None, STORE_FP32=y32 is not None, STORE_ARGMAX=arg is not None,
        NUM_K=D // BLOCK_K, REG_K=REG_K, STAGES=ring_stages(D // BLOCK_K, hidden.element_size()),
        CONSUMER_REGS=CONSUMER_REGS, PRODUCER_REGS=PRODUCER_REGS, num_warps=4, maxnreg=MAXNREG)
