typedef long long i64;
typedef unsigned long long u64;
#define FULL 0xffffffffu
#define NT (WARPS * 32)
#define RPW (SPAN / 64 / WARPS)   // read-out rows of 64 docs per warp
// WEIGHT 0: int32 doc ids + float32 weights, 4 postings per 16-byte load; 1 / 2: compact postings
// (lsr.index.compact: uint16 block-local ids + bf16 / fp16 weights, weight 0 = padding), 8 per load
#if WEIGHT
typedef unsigned short doc_t;
typedef unsigned short weight_t;
#define PL 8
#define LOG_STEP 8
#else
typedef int doc_t;
typedef float weight_t;
#define PL 4
#define LOG_STEP 7
#endif
#define STEP (32 * PL)             // postings per warp step
#if COARSE
// coarse contributions in float32: floor(a * w) with a = w_query * scale / 2^CSHIFT, exact in float32 and
// a * w <= 2^(61 - CSHIFT) < 2^23: fma_rz(a, w, 2^23) rounds a * w + 2^23, which lies in [2^23, 2^24) where
// the float32 spacing is 1, once toward zero, so its mantissa holds floor(a * w) (no 64-bit conversion per
// posting). A doc's coarse sum is < 2^(61 - CSHIFT) = 2^16: two docs share a uint32 word (doc 2i in the low
// half), and an add to one half never carries into the other
#if 61 - CSHIFT > 16
#error "coarse sums take 16 bits: CSHIFT >= 45"
#endif
#define CELLS (SPAN / 2)
#define RROW 128                   // docs per read-out row: a uint2 of two words per lane
typedef float qmul_t;
#else
#define CELLS (LIMBS * SPAN)
#define RROW 64
typedef double qmul_t;
#endif
#if COARSE && !ROWMAX && SPAN / RROW / WARPS > 64
#error "the coarse read-out notes its rows in 64 bits: SPAN / 128 / WARPS <= 64"
#endif

__device__ __forceinline__ unsigned word(const uint4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

// posting e of a lane's 16-byte loads: (cell in the span, weight, real). The span divides the block, so
// the low bits of a global or block-local id are its cell; padding: doc -1 or weight 0
__device__ __forceinline__ float posting(const uint4& d, const uint4& w, int e, int& cell, bool& real) {
#if WEIGHT
    const int sh = 16 * (e & 1);
    const unsigned h = (word(w, e >> 1) >> sh) & 0xffffu;
    cell = (int)((word(d, e >> 1) >> sh) & (SPAN - 1));
    real = h != 0u;
#if WEIGHT == 1
    return __uint_as_float(h << 16);                               // bf16: the high half of a float
#else
    const unsigned ex = (h >> 10) & 31u, m = h & 1023u, sign = (h & 0x8000u) << 16;
    if (ex == 0u) return __uint_as_float(sign | __float_as_uint((float)m * 0x1p-24f));   // subnormal: exact
    return __uint_as_float(sign | (ex == 31u ? 0x7f800000u : (ex + 112u) << 23) | (m << 13));
#endif
#else
    const int doc = (int)word(d, e);
    cell = doc & (SPAN - 1);
    real = doc >= 0;
    return __uint_as_float(word(w, e));
#endif
}

#if COARSE
// adds a posting's coarse contribution floor(w * q) to its doc's 16-bit half of the tile word. The half's shift is a
// multiply by 1 or 2^16 with the 2^23 bias folded in ((bits - 2^23 bias) * s mod 2^32): multiply-adds run on the
// FMA pipe, while shifts, logic and compares load the ALU pipe, which the adds saturate (docs/performance/search.md)
__device__ __forceinline__ void coarse_add(unsigned* tile, int cell, float w, float q) {
    const unsigned s = (unsigned)(cell & 1) * 65535u + 1u;
    atomicAdd(tile + (cell >> 1), __float_as_uint(__fmaf_rz(w, q, 0x1p23f)) * s + s * 0xb5000000u);
}

// a coarse key: the 16-bit sum above bit KSHIFT, 2^31 - 1 - doc below (lsr.search.kernels.coarse)
__device__ __forceinline__ i64 coarse_key(unsigned sum, i64 doc) { return ((i64)sum << KSHIFT) | (0x7fffffffLL - doc); }
#endif

__device__ __forceinline__ i64 pack_key(float s, i64 doc) {
    // lsr.search.kernels.topk.pack_key: bits(score) << 31 | (2^31 - 1 - doc); -1 for scores <= 0
    return s > 0.f ? (((i64)__float_as_int(s)) << 31) | (0x7fffffffLL - doc) : -1LL;
}

// the int64 sums of cells 2i and 2i + 1 from their limbs (limb sums may exceed 24 bits: shifts add them)
__device__ __forceinline__ longlong2 peek(const unsigned* h, const unsigned* m, const unsigned* l, int i) {
    const uint2 a = reinterpret_cast<const uint2*>(h)[i], b = reinterpret_cast<const uint2*>(m)[i],
                c = reinterpret_cast<const uint2*>(l)[i];
    return make_longlong2(((i64)a.x << 48) + ((i64)b.x << 24) + (i64)c.x, ((i64)a.y << 48) + ((i64)b.y << 24) + (i64)c.y);
}

__device__ __forceinline__ longlong2 take(unsigned* h, unsigned* m, unsigned* l, int i) {   // read and zero
    const longlong2 v = peek(h, m, l, i);
    reinterpret_cast<uint2*>(h)[i] = make_uint2(0u, 0u);
    reinterpret_cast<uint2*>(m)[i] = make_uint2(0u, 0u);
    reinterpret_cast<uint2*>(l)[i] = make_uint2(0u, 0u);
    return v;
}

extern "C" __global__ void __launch_bounds__(NT, MIN_CTAS)
lsr_block_scores(const doc_t* __restrict__ post_doc, const weight_t* __restrict__ post_w,
                 const i64* __restrict__ span_off, int stride_so,
                 const i64* __restrict__ q_indptr, const int* __restrict__ q_terms,
                 const float* __restrict__ q_w, const double* __restrict__ scale,
                 const double* __restrict__ inv_scale, const float* __restrict__ theta,
                 const long long* __restrict__ coarse_lo,
                 const int* __restrict__ item_q, const int* __restrict__ item_span,
                 const i64* __restrict__ item_out, int n_items,
                 i64* __restrict__ out, int* __restrict__ counts, int* __restrict__ next_item)
{
    // the int64 sums as three 24-bit limbs in uint32 cells (hi: bits 48.., mid: 24..47, lo: 0..23):
    // native 32-bit shared atomics, no compare-and-swap loop; a cell takes at most one add per query
    // term, so TG <= 256 adds of < 2^24 never overflow a limb between normalisations
    // COARSE: one 16-bit half of a uint32 word per doc holding the sum of (contribution >> CSHIFT)
    extern __shared__ __align__(16) i64 smem[];
    unsigned* t_hi24 = (unsigned*)smem;
    unsigned* t_mid = t_hi24 + SPAN;
    unsigned* t_low = t_mid + SPAN;
    i64* t_base = (i64*)(t_hi24 + CELLS);   // per run: where its step c reads (base + STEP c)
    double* t_wq = (double*)(t_base + TG);     // query weight * scale
    int* t_lo = (int*)(t_wq + TG);             // run [base + lo, base + hi) in the postings
    int* t_hi = t_lo + TG;
    int* t_cum = t_hi + TG;                    // inclusive prefix sum of steps per run
    int* w_count = t_cum + TG;                 // hits per warp segment (read-out)
    int* s_item = w_count + WARPS;             // the item this CTA works on
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    for (int i = tid; i < CELLS; i += NT) t_hi24[i] = 0u;
    __syncthreads();
    // items are taken in order from a global counter, so the CTAs work on neighbouring items (one or two
    // spans) at any time and the span's postings stay in L2 for all the queries that read them (a fixed
    // stride lets slow CTAs fall behind by many spans)
    // (the next item is claimed while this one is scored: the counter's latency stays off the path)
    if (tid == 0) *s_item = atomicAdd(next_item, 1);
    __syncthreads();
    for (;;) {
        const int item = *s_item;
        if (item >= n_items) break;
        int next = 0;
        if (tid == 0) next = atomicAdd(next_item, 1);
        const int q = item_q[item];
        const int span = item_span[item];
        const i64 out0 = item_out[item];
        const i64 doc0 = (i64)span * SPAN;
        const i64 qs = q_indptr[q], qe = q_indptr[q + 1];
        const double sc = scale[q];
        int unusual = 0;
        for (i64 g = qs; g < qe; g += TG) {
            // ---- the runs of terms g.. in this span, read in 16-byte aligned steps of STEP postings
            for (int i = tid; i < TG; i += NT) {
                i64 rs = 0, re = 0;
                double wqs = 0.0;
                if (g + i < qe) {
                    const i64* so = span_off + (i64)q_terms[g + i] * stride_so + span;
                    rs = so[0];
                    re = so[1];
                    wqs = (double)q_w[g + i] * sc;
#if COARSE
                    wqs *= 1.0 / (double)(1ull << CSHIFT);
                    // outside float32's normal range the coarse factor would not be exact: the items of such
                    // a query report an overflow, which sends it to the exact pass 2
                    unusual |= wqs != 0.0 && (wqs < 0x1p-126 || wqs >= 0x1p128);
#endif
                }
                const i64 a = rs & ~(i64)(PL - 1);   // 16-byte aligned start; lo and hi are relative to it
                t_base[i] = a;
                t_lo[i] = (int)(rs - a);
                t_hi[i] = (int)(re - a);
                t_wq[i] = wqs;
                t_cum[i] = re > rs ? (int)((re - a + STEP - 1) >> LOG_STEP) : 0;
            }
            unusual = __syncthreads_or(unusual);
            if (warp == 0) {                   // inclusive scan of t_cum: TG / 32 entries per lane
                int run = 0;
                #pragma unroll
                for (int j = 0; j < TG / 32; ++j) run += t_cum[lane * (TG / 32) + j];
                int inc = run;
                #pragma unroll
                for (int d = 1; d < 32; d <<= 1) {
                    const int y = __shfl_up_sync(FULL, inc, d);
                    if (lane >= d) inc += y;
                }
                int acc = inc - run;
                #pragma unroll
                for (int j = 0; j < TG / 32; ++j) {
                    const int n = t_cum[lane * (TG / 32) + j];
                    // step c of the run reads base + STEP c: bounds move by the steps before the run
                    t_base[lane * (TG / 32) + j] -= (i64)acc * STEP;
                    t_lo[lane * (TG / 32) + j] += acc * STEP;
                    t_hi[lane * (TG / 32) + j] += acc * STEP;
                    acc += n;
                    t_cum[lane * (TG / 32) + j] = acc;
                }
            }
            __syncthreads();
            // ---- warp w takes a contiguous range of the steps; shared atomics: runs of different terms
            // may hit one doc at the same time (integer adds commute: the sums are exact and deterministic).
            // The step's run is warp-uniform and kept in registers, and the next step's loads are issued
            // before this step's adds.
            const int total = t_cum[TG - 1];
            const int c_end = (int)((i64)total * (warp + 1) / WARPS);
            int c = (int)((i64)total * warp / WARPS);
            if (c < c_end) {
                int r = 0;
                {
                    int lo = 0, hi = TG - 1;   // first run with t_cum > c
                    while (lo < hi) { const int mid = (lo + hi) >> 1; if (t_cum[mid] > c) hi = mid; else lo = mid + 1; }
                    r = lo;
                }
                int bound = t_cum[r], rlo = t_lo[r], rhi = t_hi[r];
                qmul_t wq = (qmul_t)t_wq[r];
                const doc_t* pd = post_doc + t_base[r];
                const weight_t* pw = post_w + t_base[r];
                // step cc: the lane reads postings x0 .. x0 + PL - 1 of its run (from pd / pw); bit e of the
                // mask: x0 + e lies in the run [rlo, rhi). A lane with nothing to read loads the run's start.
                auto load = [&](int cc, uint4& d, uint4& w, unsigned& m, qmul_t& q) {
                    while (cc >= bound) {      // warp-uniform: the next run
                        ++r;
                        bound = t_cum[r];
                        rlo = t_lo[r];
                        rhi = t_hi[r];
                        wq = (qmul_t)t_wq[r];
                        pd = post_doc + t_base[r];
                        pw = post_w + t_base[r];
                    }
                    const int x0 = cc * STEP + PL * lane;
                    const int a = max(rlo - x0, 0), b = min(rhi - x0, PL);
                    m = b > a ? (1u << b) - (1u << a) : 0u;
                    const int xs = m ? x0 : (rlo & ~(PL - 1));
                    d = __ldg(reinterpret_cast<const uint4*>(pd + xs));
                    w = __ldg(reinterpret_cast<const uint4*>(pw + xs));
                    q = wq;
                };
                // postings outside the run (another run's docs) and padding are skipped; the run's own
                // docs lie in the span, so doc % SPAN is their cell. The skip stays a branch: sending idle
                // lanes to a shared cell serialised their atomics (60-80% slower, docs/performance/search.md)
                auto add = [&](const uint4& d, const uint4& w, unsigned m, qmul_t q) {
#if COARSE && WEIGHT
                    // a step whose lanes all hold 8 postings of the run (most steps of a long run): the adds need no
                    // test and no branch (compact padding adds 0)
                    if (__all_sync(FULL, m == 0xffu)) {
                        #pragma unroll
                        for (int e = 0; e < PL; ++e) {
                            int c_e;
                            bool real;
                            const float we = posting(d, w, e, c_e, real);
                            coarse_add(t_hi24, c_e, we, q);
                        }
                        return;
                    }
#endif
                    #pragma unroll
                    for (int e = 0; e < PL; ++e) {
                        int c_e;
                        bool real;
                        const float we = posting(d, w, e, c_e, real);
#if COARSE
                        // compact padding is weight 0 (it adds 0: no test); a float32 posting's padding is its doc
                        // id -1, whose weight the kernel does not rely on
                        if ((m & (1u << e)) && (WEIGHT || real)) coarse_add(t_hi24, c_e, we, q);
#else
                        const bool ok = (m & (1u << e)) && real;
                        unsigned* cell = t_hi24 + c_e;
                        const u64 v = (u64)(i64)((double)we * q);
                        if (ok) {
                            atomicAdd(cell, (unsigned)(v >> 48));
                            atomicAdd(cell + SPAN, (unsigned)(v >> 24) & 0xffffffu);
                            atomicAdd(cell + 2 * SPAN, (unsigned)v & 0xffffffu);
                        }
#endif
                    }
                };
                // two steps in flight: the next step's loads are issued before this step's adds
                uint4 dA, dB, wA, wB;
                unsigned mA, mB;
                qmul_t qA, qB;
                load(c, dA, wA, mA, qA);
                for (;; c += 2) {
                    const bool more1 = c + 1 < c_end;
                    if (more1) load(c + 1, dB, wB, mB, qB);
                    add(dA, wA, mA, qA);
                    if (!more1) break;
                    const bool more2 = c + 2 < c_end;
                    if (more2) load(c + 2, dA, wA, mA, qA);
                    add(dB, wB, mB, qB);
                    if (!more2) break;
                }
            }
            __syncthreads();                   // all adds land; the run table may be refilled
            if (!COARSE && g + TG < qe) {      // more terms follow: carry the limbs (keeps them < 2^25)
                for (int i = tid; i < SPAN; i += NT) {
                    const unsigned l = t_low[i], m = t_mid[i] + (l >> 24);
                    t_low[i] = l & 0xffffffu;
                    t_mid[i] = m & 0xffffffu;
                    t_hi24[i] += m >> 24;
                }
                __syncthreads();
            }
        }
        // ---- read out (and zero) the tile: warp w owns rows [w R, (w + 1) R) of RROW docs (64, 2 per lane;
        // coarse: 128, 4 per lane)
        const double inv = inv_scale[q];
        const int R = SPAN / RROW / WARPS;
#if COARSE
        // lane L of a read-out row holds docs 4L .. 4L + 3 (two words, each two 16-bit sums, low half first)
        auto sums4 = [](const uint2& a, unsigned* s) {
            s[0] = a.x & 0xffffu; s[1] = a.x >> 16; s[2] = a.y & 0xffffu; s[3] = a.y >> 16;
        };
#endif
#if COARSE && ROWMAX
        // pass 1 on coarse sums: every 32-doc row's best coarse key (-1 for a row of zeros), as ROWMAX below;
        // -1 everywhere for a query whose coarse factor is not exact (its theta becomes 0: no pruning)
        for (int j = warp * R; j < (warp + 1) * R; ++j) {
            uint2* cell = reinterpret_cast<uint2*>(t_hi24) + j * 32 + lane;
            const uint2 a = *cell;
            *cell = make_uint2(0u, 0u);
            unsigned sm[4];
            sums4(a, sm);
            const i64 d = doc0 + j * RROW + 4 * lane;
            i64 best = -1LL;
            #pragma unroll
            for (int e = 0; e < 4; ++e) best = max(best, sm[e] ? coarse_key(sm[e], d + e) : -1LL);
            #pragma unroll
            for (int m = 4; m > 0; m >>= 1) best = max(best, __shfl_xor_sync(FULL, best, m));   // 8 lanes = 32 docs
            if ((lane & 7) == 0) out[out0 + 4 * j + (lane >> 3)] = unusual ? -1LL : best;
        }
#elif COARSE
        // coarse keys (sum << KSHIFT | 2^31 - 1 - doc) of the docs whose coarse sum reaches lo[q], CAP slots
        // in ascending doc order + a count, as below. One pass zeroes the rows without a hit and notes the
        // others (a few per item), which the second pass reads, writes out and zeroes
        const unsigned clo = (unsigned)coarse_lo[q];
        int n_hit = 0;
        u64 rows = 0;                          // bit jj: row warp * R + jj holds a hit (R <= 64)
        for (int jj = 0; jj < R; ++jj) {
            uint2* cell = reinterpret_cast<uint2*>(t_hi24) + (warp * R + jj) * 32 + lane;
            const uint2 a = *cell;
            unsigned sm[4];
            sums4(a, sm);
            int n = 0;                         // the row's hits (ballots: any architecture)
            #pragma unroll
            for (int e = 0; e < 4; ++e) n += __popc(__ballot_sync(FULL, sm[e] >= clo));
            if (n) {
                rows |= 1ull << jj;
                n_hit += n;
            } else {
                *cell = make_uint2(0u, 0u);
            }
        }
        if (lane == 0) w_count[warp] = n_hit;
        __syncthreads();
        int base = 0, all = 0;
        for (int v = 0; v < WARPS; ++v) { base += v < warp ? w_count[v] : 0; all += w_count[v]; }
        for (; rows; rows &= rows - 1) {
            const int j = warp * R + __ffsll((long long)rows) - 1;
            uint2* cell = reinterpret_cast<uint2*>(t_hi24) + j * 32 + lane;
            const uint2 a = *cell;
            *cell = make_uint2(0u, 0u);
            unsigned sm[4];
            sums4(a, sm);
            // the lane's first slot follows the hits of the lanes below it (docs ascending: lane, then quarter)
            const unsigned below = (1u << lane) - 1u;
            int slot = base, n = 0;
            #pragma unroll
            for (int e = 0; e < 4; ++e) {
                const unsigned m = __ballot_sync(FULL, sm[e] >= clo);
                slot += __popc(m & below);
                n += __popc(m);
            }
            if (base < CAP) {
                const i64 d = doc0 + j * RROW + 4 * lane;
                #pragma unroll
                for (int e = 0; e < 4; ++e) {
                    if (sm[e] >= clo) {
                        if (slot < CAP) out[out0 + slot] = coarse_key(sm[e], d + e);
                        ++slot;
                    }
                }
            }
            base += n;
        }
        if (tid == 0) counts[out0 / CAP] = unusual ? CAP + 1 : all;
#elif ROWMAX
        for (int j = warp * R; j < (warp + 1) * R; ++j) {
            const longlong2 a = take(t_hi24, t_mid, t_low, j * 32 + lane);
            const i64 d = doc0 + j * 64 + 2 * lane;
            i64 best = max(pack_key((float)((double)a.x * inv), d), pack_key((float)((double)a.y * inv), d + 1));
            #pragma unroll
            for (int m = 8; m > 0; m >>= 1) best = max(best, __shfl_xor_sync(FULL, best, m));  // 16 lanes = 32 docs
            if ((lane & 15) == 0) out[out0 + 2 * j + (lane >> 4)] = best;
        }
#else
        // acc < alo implies score < theta (scores are monotone in acc): most rows skip the conversion.
        // Hits are counted per warp, then written after the hits of the warps before it, so the slots
        // hold the first CAP hits in ascending doc order whatever the warp timing.
        const float th = theta[q];
        const double lim = (double)nextafterf(th, 0.f) * sc * (1.0 - 0x1p-50);
        const i64 alo = th > 0.f ? (lim >= 0x1p62 ? 0x7fffffffffffffffLL : max((i64)lim, 1LL)) : 1LL;
        const unsigned below = (1u << lane) - 1u;
        int n_hit = 0;
#if RPW <= 8
        // one pass over the tile: each warp keeps its rows' hit masks and scores in registers
        unsigned hm0[RPW], hm1[RPW];
        float hs0[RPW], hs1[RPW];
        #pragma unroll
        for (int jj = 0; jj < RPW; ++jj) {
            const longlong2 a = take(t_hi24, t_mid, t_low, (warp * RPW + jj) * 32 + lane);
            hm0[jj] = hm1[jj] = 0u;
            hs0[jj] = hs1[jj] = 0.f;
            if (__any_sync(FULL, a.x >= alo || a.y >= alo)) {
                hs0[jj] = (float)((double)a.x * inv);
                hs1[jj] = (float)((double)a.y * inv);
                hm0[jj] = __ballot_sync(FULL, hs0[jj] > 0.f && hs0[jj] >= th);
                hm1[jj] = __ballot_sync(FULL, hs1[jj] > 0.f && hs1[jj] >= th);
                n_hit += __popc(hm0[jj]) + __popc(hm1[jj]);
            }
        }
        if (lane == 0) w_count[warp] = n_hit;
        __syncthreads();
        int base = 0, all = 0;
        for (int v = 0; v < WARPS; ++v) { base += v < warp ? w_count[v] : 0; all += w_count[v]; }
        #pragma unroll
        for (int jj = 0; jj < RPW; ++jj) {
            if (base < CAP && (hm0[jj] | hm1[jj])) {
                const bool h0 = (hm0[jj] >> lane) & 1u, h1 = (hm1[jj] >> lane) & 1u;
                const int slot = base + __popc(hm0[jj] & below) + __popc(hm1[jj] & below);
                const i64 d = doc0 + (warp * RPW + jj) * 64 + 2 * lane;
                if (h0 && slot < CAP) out[out0 + slot] = pack_key(hs0[jj], d);
                if (h1 && slot + h0 < CAP) out[out0 + slot + h0] = pack_key(hs1[jj], d + 1);
                base += __popc(hm0[jj]) + __popc(hm1[jj]);
            }
        }
#else
        // many rows per warp: count first, then read again to write (registers would spill)
        for (int j = warp * R; j < (warp + 1) * R; ++j) {
            const longlong2 a = peek(t_hi24, t_mid, t_low, j * 32 + lane);
            if (__any_sync(FULL, a.x >= alo || a.y >= alo)) {
                const float s0 = (float)((double)a.x * inv), s1 = (float)((double)a.y * inv);
                n_hit += __popc(__ballot_sync(FULL, s0 > 0.f && s0 >= th)) + __popc(__ballot_sync(FULL, s1 > 0.f && s1 >= th));
            }
        }
        if (lane == 0) w_count[warp] = n_hit;
        __syncthreads();
        int base = 0, all = 0;
        for (int v = 0; v < WARPS; ++v) { base += v < warp ? w_count[v] : 0; all += w_count[v]; }
        for (int j = warp * R; j < (warp + 1) * R; ++j) {
            const longlong2 a = take(t_hi24, t_mid, t_low, j * 32 + lane);
            if (base < CAP && __any_sync(FULL, a.x >= alo || a.y >= alo)) {
                const float s0 = (float)((double)a.x * inv), s1 = (float)((double)a.y * inv);
                const bool h0 = s0 > 0.f && s0 >= th, h1 = s1 > 0.f && s1 >= th;
                const unsigned m0 = __ballot_sync(FULL, h0), m1 = __ballot_sync(FULL, h1);
                const int slot = base + __popc(m0 & below) + __popc(m1 & below);
                const i64 d = doc0 + j * 64 + 2 * lane;
                if (h0 && slot < CAP) out[out0 + slot] = pack_key(s0, d);
                if (h1 && slot + h0 < CAP) out[out0 + slot + h0] = pack_key(s1, d + 1);
                base += __popc(m0) + __popc(m1);
            }
        }
#endif
        if (tid == 0) counts[out0 / CAP] = all;
#endif
        // one barrier hands the next item over: every thread read s_item before this item's first barrier, and
        // the next item's adds start after its run-table barriers, which a warp reaches only when its
        // read-out (zeros, w_count reads) is done
        if (tid == 0) *s_item = next;
        __syncthreads();
    }
}
