typedef long long i64;

#define MAX_CTA_CELLS 64   // rescore_cuda._CTA_CELLS
#ifndef UNROLL
#define UNROLL 4           // terms a lane loads before it uses any (2 and 8 measured the same: docs/performance/search.md)
#endif

// A CTA scores up to CTA_CELLS cells of one query (blockIdx.y), a warp per cell. The query's terms are first marked
// in a shared-memory bitmap of the vocabulary, so a doc term outside the query (most of them: a doc holds ~100-400
// terms, a query ~20-50) costs one shared read instead of a lookup in the dense [B, V] query matrix; its
// contribution would be 0 anyway (0 * w = 0 in the fixed point), so the sum is unchanged.
extern "C" __global__ void lsr_rescore(const i64* __restrict__ indptr, const int* __restrict__ terms,
                                       const float* __restrict__ weights, const float* __restrict__ qd,
                                       int stride_qd, const double* __restrict__ scale,
                                       const double* __restrict__ inv_scale, const i64* __restrict__ cand,
                                       int C, int n_docs, const i64* __restrict__ q_indptr,
                                       const int* __restrict__ q_terms, int vocab, int cta_cells,
                                       float* __restrict__ out)
{
    extern __shared__ unsigned in_query[];     // bit t: term t is one of the query's (ceil(vocab / 32) words)
    __shared__ i64 row_lo[MAX_CTA_CELLS], row_hi[MAX_CTA_CELLS];   // the CTA's cells' CSR rows (empty: no doc)
    const int q = blockIdx.y;
    const int warps = blockDim.x >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int words = (vocab + 31) >> 5;
    const int c0 = blockIdx.x * cta_cells, n_cells = min(C - c0, cta_cells);
    // every cell's doc and row bounds read up front by the whole CTA, so a warp's cells do not each wait for
    // two dependent loads (candidate, then indptr) before their terms
    for (int i = threadIdx.x; i < n_cells; i += blockDim.x) {
        const i64 doc = cand[(i64)q * C + c0 + i];
        const bool ok = doc >= 0 && doc < n_docs;
        row_lo[i] = ok ? indptr[doc] : 0;
        row_hi[i] = ok ? indptr[doc + 1] : 0;
    }
    for (int i = threadIdx.x; i < words; i += blockDim.x) in_query[i] = 0u;
    __syncthreads();
    for (i64 p = q_indptr[q] + threadIdx.x; p < q_indptr[q + 1]; p += blockDim.x) {
        const int t = q_terms[p];
        if (t >= 0 && t < vocab) atomicOr(in_query + (t >> 5), 1u << (t & 31));
    }
    __syncthreads();
    const double sc = scale[q], inv = inv_scale[q];
    const float* row = qd + (i64)q * stride_qd;
    for (int i = warp; i < n_cells; i += warps) {
        const i64 a = row_lo[i], b = row_hi[i];
        i64 acc = 0;                           // lsr.search.kernels.fixed.to_fixed: (w_query * w_doc * scale) -> int64
        // UNROLL terms a lane at once, their loads issued before any is used (integer sums: any order, same bits)
        for (i64 p0 = a + lane; p0 < b; p0 += 32 * UNROLL) {
            int t[UNROLL];
            float w[UNROLL];
            #pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                const i64 p = p0 + 32 * u;
                t[u] = p < b ? terms[p] : -1;
                w[u] = p < b ? weights[p] : 0.f;
            }
            #pragma unroll
            for (int u = 0; u < UNROLL; ++u)
                if (t[u] >= 0 && ((in_query[t[u] >> 5] >> (t[u] & 31)) & 1u))
                    acc += (i64)((double)row[t[u]] * (double)w[u] * sc);
        }
        #pragma unroll
        for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
        if (lane == 0) out[(i64)q * C + c0 + i] = (float)((double)acc * inv);   // no doc: 0 * inv = 0
    }
}
