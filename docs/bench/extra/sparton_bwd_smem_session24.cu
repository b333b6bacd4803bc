// Experiment record of session 24 (docs/notes-sparton.md): shared-memory-staged CUDA kernels for the Sparton
// backward, measured slower than the Triton kernels on an H200 and not part of the package. Kept so that a later
// attempt starts from what was measured (sparton_bwd_cuda_prototypes_session24_h200.json, ncu_*session24*).
// Sparton backward, the weight gradient: dE[v, :] = sum_b g[b, v] * H[b, a[b, v], :] (b ascending), db[v] = sum_b g[b, v].
//
// One CTA owns 2,048 vocabulary rows x 16 hidden columns, accumulated in registers (4 rows x 16 columns a thread).
// For each batch row b it stages H[b, :, d0:d0+16] (32 bytes a position; H arrives tiled as [B, D / 16, S, 16]) in
// shared memory with cp.async, double buffered, and every thread gathers its rows' argmax positions from there. The gathers that the Triton kernel issues
// to L2 (one 1,536-byte row of H per (b, v) pair: 24.6 GB at 64 x 512 x 250,002) become shared-memory reads; L2
// then serves only the staged slices (S x 32 bytes per (b, tile)) and g / a. CTAs are issued in groups of GROUP_V
// vocabulary tiles per hidden tile, so the H slices and the g / a rows that run side by side share L2.
// H and dE are bf16 (raw bits, converted by hand: NVRTC needs no headers). Fixed summation order: deterministic.
typedef unsigned short u16;
typedef long long i64;

#define DT 16        // hidden columns a CTA owns
#define THREADS 512
#define VPT 4        // vocabulary rows a thread owns
#define VT (THREADS * VPT)
#define GROUP_V 16
#define NST 4        // pipeline stages of the dE kernel (3 batch rows in flight)

__device__ __forceinline__ float bf16_low(unsigned int w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_high(unsigned int w) { return __uint_as_float(w & 0xffff0000u); }

__device__ __forceinline__ unsigned int bf16_bits(float x) {   // round to nearest even, NaN stays NaN
    const unsigned int u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x40u;
    return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}

__device__ __forceinline__ unsigned int smem_addr(const void* p) {
    unsigned int s;
    asm volatile("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(s) : "l"(p));
    return s;
}
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(smem_addr(smem)), "l"(gmem));
}
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" :: "r"(smem_addr(smem)), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int N> __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" :: "n"(N)); }

// the indices i < n with flag[i] != 0, ascending, into list (shared); returns their count. Warp 0 compacts with ballots.
__device__ int compact_flags(const unsigned char* flag, int n, int* list) {
    __shared__ int count;
    if (threadIdx.x < 32) {
        int total = 0;
        for (int i0 = 0; i0 < n; i0 += 32) {
            const int i = i0 + threadIdx.x;
            const bool on = i < n && flag[i] != 0;
            const unsigned int mask = __ballot_sync(0xffffffffu, on);
            if (on) list[total + __popc(mask & ((1u << threadIdx.x) - 1u))] = i;
            total += __popc(mask);
        }
        if (threadIdx.x == 0) count = total;
    }
    __syncthreads();
    return count;
}

// unit u of a staged slice: position r = u / 2, half h = u % 2 (8 bf16 each), kept at 2 r + (h ^ bit 2 of r) so that
// the random positions of a warp's gathers spread over all eight 16-byte bank groups
__device__ __forceinline__ int stage_slot(int r, int h) { return 2 * r + (h ^ ((r >> 2) & 1)); }

// Ht is H tiled as [B, D / 16, S, 16], so a slice is 32 S contiguous bytes (full L2 lines, not 32-byte pieces)
__device__ __forceinline__ void stage_slice(uint4* dst, const u16* Ht, i64 b, int n_d, int dt, int S) {
    const uint4* src = reinterpret_cast<const uint4*>(Ht + ((b * n_d + dt) * S) * DT);
    for (int u = threadIdx.x; u < 2 * S; u += THREADS) cp_async16(dst + stage_slot(u >> 1, u & 1), src + u);
}

__device__ __forceinline__ void fma8(float* acc, float g, uint4 p) {
    acc[0] = fmaf(g, bf16_low(p.x), acc[0]);  acc[1] = fmaf(g, bf16_high(p.x), acc[1]);
    acc[2] = fmaf(g, bf16_low(p.y), acc[2]);  acc[3] = fmaf(g, bf16_high(p.y), acc[3]);
    acc[4] = fmaf(g, bf16_low(p.z), acc[4]);  acc[5] = fmaf(g, bf16_high(p.z), acc[5]);
    acc[6] = fmaf(g, bf16_low(p.w), acc[6]);  acc[7] = fmaf(g, bf16_high(p.w), acc[7]);
}

__device__ __forceinline__ uint4 pack8(const float* x) {
    return make_uint4(bf16_bits(x[0]) | (bf16_bits(x[1]) << 16), bf16_bits(x[2]) | (bf16_bits(x[3]) << 16),
                      bf16_bits(x[4]) | (bf16_bits(x[5]) << 16), bf16_bits(x[6]) | (bf16_bits(x[7]) << 16));
}

// One pipeline stage of the dE kernel: row b's H slice (2 S units), then its g and a over the CTA's VT vocabulary rows.
__device__ __forceinline__ void stage_de_row(uint4* st, const u16* Ht, const float* g, const int* a, i64 b, int n_d,
                                             int dt, int S, int V, int vt) {
    stage_slice(st, Ht, b, n_d, dt, S);
    float* gs = reinterpret_cast<float*>(st + 2 * S);
    int* as = reinterpret_cast<int*>(gs + VT);
    const i64 v0 = (i64)vt * VT;
    for (int e = threadIdx.x; e < VT && v0 + e < V; e += THREADS) {   // rows of g are not 16-byte aligned
        cp_async4(gs + e, g + b * V + v0 + e);
        cp_async4(as + e, a + b * V + v0 + e);
    }
}

// live[vt * B + b] != 0 where row b has a gradient in vocabulary tile vt: only those rows are staged, so a trained head's
// tiles skip most of the H traffic.
extern "C" __global__ void __launch_bounds__(THREADS, 1)
lsr_sparton_de(const u16* __restrict__ Ht, const float* __restrict__ g, const int* __restrict__ a,
               const unsigned char* __restrict__ live, u16* __restrict__ dE, float* __restrict__ db, int B, int S,
               int V, int D)
{
    extern __shared__ uint4 smem[];   // NST stages of 2 S + VT / 2 units, then the list of live rows
    const int n_d = D / DT, n_vt = (V + VT - 1) / VT, stage_units = 2 * S + VT / 2;
    const int grp = blockIdx.x / (GROUP_V * n_d), in = blockIdx.x % (GROUP_V * n_d);
    const int width = min(GROUP_V, n_vt - grp * GROUP_V);
    const int vt = grp * GROUP_V + in % width, dt = in / width;
    int* rows = reinterpret_cast<int*>(smem + NST * stage_units);
    const int n_live = compact_flags(live + (i64)vt * B, B, rows);
    float acc[VPT][DT], gsum[VPT];
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
        gsum[j] = 0.f;
#pragma unroll
        for (int c = 0; c < DT; ++c) acc[j][c] = 0.f;
    }
#pragma unroll
    for (int k = 0; k < NST - 1; ++k) {
        if (k < n_live) stage_de_row(smem + k * stage_units, Ht, g, a, rows[k], n_d, dt, S, V, vt);
        cp_async_commit();
    }
    for (int k = 0; k < n_live; ++k) {
        cp_async_wait<NST - 2>();
        __syncthreads();   // row k is in; every thread is done with row k - 1's stage, which row k + NST - 1 takes
        if (k + NST - 1 < n_live)
            stage_de_row(smem + ((k + NST - 1) % NST) * stage_units, Ht, g, a, rows[k + NST - 1], n_d, dt, S, V, vt);
        cp_async_commit();
        const uint4* slice = smem + (k % NST) * stage_units;
        const float* gs = reinterpret_cast<const float*>(slice + 2 * S);
        const int* as = reinterpret_cast<const int*>(gs + VT);
#pragma unroll
        for (int j = 0; j < VPT; ++j) {
            const int e = j * THREADS + threadIdx.x;
            if ((i64)vt * VT + e >= V) continue;
            const float gj = gs[e];
            gsum[j] += gj;
            if (gj != 0.f) {
                const int r = as[e];
                fma8(acc[j], gj, slice[stage_slot(r, 0)]);
                fma8(acc[j] + 8, gj, slice[stage_slot(r, 1)]);
            }
        }
    }
    cp_async_wait<0>();
    const int d0 = dt * DT;
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
        const i64 v = (i64)vt * VT + j * THREADS + threadIdx.x;
        if (v >= V) continue;
        uint4* out = reinterpret_cast<uint4*>(dE + v * D + d0);
        out[0] = pack8(acc[j]);
        out[1] = pack8(acc[j] + 8);
        if (d0 == 0) db[v] = gsum[j];
    }
}

// ---- the hidden-state gradient: dH[b, s, :] = sum over v with a[b, v] = s of g[b, v] * E[v, :]
//
// The (b, v) entries arrive bucket-sorted by key (b * n_chunks + v / VC) * S + a[b, v] (bucket starts in off, entry i's
// vocabulary row vs[i] and gradient gs[i]). One CTA owns 2,048 consecutive rows r = b * S + s (several batch rows at
// S <= 512) x 16 hidden columns, accumulated in registers (4 rows a thread). It walks the vocabulary in chunks of VC
// rows: stages E[chunk, d0:d0+16] (Et: E tiled as [D / 16, V, 16]) in shared memory, NSTH deep, and every thread sums
// its rows' buckets of that chunk from there, the four rows' entries loaded side by side. Each staged E row serves
// every batch row of the CTA, so L2 serves E once per 2,048 rows instead of once per (b, v) pair. Chunks without an
// entry for the CTA's batch rows (most of them for a trained head) are not staged. Sum order: chunks ascending, then
// the bucket's order.
#define RPT 4                        // rows a thread owns
#define ROWS_PER_CTA (THREADS * RPT)
#define VC 2048                      // vocabulary rows staged per chunk: 64 KB
#define NSTH 3

__device__ __forceinline__ void stage_chunk(uint4* dst, const uint4* Et_tile, i64 c, int V) {
    const int n = 2 * (int)min((i64)VC, V - c * VC);
    const uint4* src = Et_tile + 2 * c * VC;
    for (int u = threadIdx.x; u < n; u += THREADS) cp_async16(dst + stage_slot(u >> 1, u & 1), src + u);
}

__device__ __forceinline__ void load_bounds(int* st, int* en, const int* off, const i64* key0, const bool* ok, i64 c,
                                            int S) {
#pragma unroll
    for (int j = 0; j < RPT; ++j) {
        const i64 k = key0[j] + c * S;
        st[j] = ok[j] ? off[k] : 0;
        en[j] = ok[j] ? off[k + 1] : 0;
    }
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
lsr_sparton_dh(const u16* __restrict__ Et, const int* __restrict__ vs, const float* __restrict__ gs,
               const int* __restrict__ off, u16* __restrict__ dH, int B, int S, int V, int D)
{
    extern __shared__ uint4 smem[];   // NSTH chunks of 2 VC units, then the live-chunk flags and list
    const int n_chunks = (V + VC - 1) / VC, n_rb = (int)(((i64)B * S + ROWS_PER_CTA - 1) / ROWS_PER_CTA);
    // the row blocks of one hidden tile side by side: they stage the same chunks of E while L2 holds them
    const int rb = blockIdx.x % n_rb, dt = blockIdx.x / n_rb;
    const uint4* Et_tile = reinterpret_cast<const uint4*>(Et + (i64)dt * V * DT);
    unsigned char* flag = reinterpret_cast<unsigned char*>(smem + NSTH * 2 * VC);
    int* chunks = reinterpret_cast<int*>(flag + ((n_chunks + 15) & ~15));
    const i64 r_lo = (i64)rb * ROWS_PER_CTA, r_hi = min((i64)B * S, r_lo + ROWS_PER_CTA) - 1;
    const i64 b_lo = r_lo / S, b_hi = r_hi / S;
    for (int c = threadIdx.x; c < n_chunks; c += THREADS) {   // any entry of the CTA's batch rows in chunk c
        bool any = false;
        for (i64 b = b_lo; b <= b_hi && !any; ++b) any = off[(b * n_chunks + c + 1) * S] > off[(b * n_chunks + c) * S];
        flag[c] = any;
    }
    __syncthreads();
    const int n_live = compact_flags(flag, n_chunks, chunks);
    float acc[RPT][DT];
    i64 key0[RPT];
    bool ok[RPT];
    int st[RPT], en[RPT], st_next[RPT], en_next[RPT];
#pragma unroll
    for (int j = 0; j < RPT; ++j) {
        const i64 r = r_lo + j * THREADS + threadIdx.x;
        ok[j] = r <= r_hi;
        key0[j] = (r / S) * n_chunks * S + r % S;
#pragma unroll
        for (int c = 0; c < DT; ++c) acc[j][c] = 0.f;
    }
#pragma unroll
    for (int k = 0; k < NSTH - 1; ++k) {
        if (k < n_live) stage_chunk(smem + k * 2 * VC, Et_tile, chunks[k], V);
        cp_async_commit();
    }
    if (n_live) load_bounds(st_next, en_next, off, key0, ok, chunks[0], S);
    for (int k = 0; k < n_live; ++k) {
        const int c = chunks[k];
#pragma unroll
        for (int j = 0; j < RPT; ++j) {
            st[j] = st_next[j];
            en[j] = en_next[j];
        }
        if (k + 1 < n_live) load_bounds(st_next, en_next, off, key0, ok, chunks[k + 1], S);
        cp_async_wait<NSTH - 2>();
        __syncthreads();   // chunk k is in; every thread is done with chunk k - 1's buffer, which chunk k + NSTH - 1 takes
        if (k + NSTH - 1 < n_live) stage_chunk(smem + ((k + NSTH - 1) % NSTH) * 2 * VC, Et_tile, chunks[k + NSTH - 1], V);
        cp_async_commit();
        const uint4* chunk = smem + (k % NSTH) * 2 * VC;
        const int v0 = c * VC;
        bool more = true;
        while (more) {   // two entries of each of the four rows per round: up to 16 loads in flight
            int u[RPT][2];
            float w[RPT][2];
#pragma unroll
            for (int j = 0; j < RPT; ++j) {
#pragma unroll
                for (int q = 0; q < 2; ++q) {
                    const bool on = st[j] + q < en[j];
                    u[j][q] = on ? vs[st[j] + q] - v0 : 0;
                    w[j][q] = on ? gs[st[j] + q] : 0.f;
                }
            }
            more = false;
#pragma unroll
            for (int j = 0; j < RPT; ++j) {
#pragma unroll
                for (int q = 0; q < 2; ++q) {
                    if (w[j][q] != 0.f) {   // entries are never zero: a zero marks a slot past the bucket
                        fma8(acc[j], w[j][q], chunk[stage_slot(u[j][q], 0)]);
                        fma8(acc[j] + 8, w[j][q], chunk[stage_slot(u[j][q], 1)]);
                    }
                }
                st[j] += 2;
                more |= st[j] < en[j];
            }
        }
    }
    cp_async_wait<0>();
    const int d0 = dt * DT;
#pragma unroll
    for (int j = 0; j < RPT; ++j) {
        if (!ok[j]) continue;
        uint4* out = reinterpret_cast<uint4*>(dH + (r_lo + j * THREADS + threadIdx.x) * D + d0);
        out[0] = pack8(acc[j]);
        out[1] = pack8(acc[j] + 8);
    }
}

// E [V, D] -> Et [D / 16, V, 16]: one 32-byte piece a thread, reads along rows of E
extern "C" __global__ void lsr_tile16(const uint4* __restrict__ E, uint4* __restrict__ Et, int V, int D) {
    const int n_d = D / DT;
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (i64)V * n_d) return;
    const i64 v = i / n_d, dt = i % n_d;
    const uint4 p = E[2 * i], q = E[2 * i + 1];
    uint4* dst = Et + 2 * (dt * V + v);
    dst[0] = p;
    dst[1] = q;
}
