typedef long long i64;

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
    const int q = blockIdx.y;
    const int warps = blockDim.x >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int words = (vocab + 31) >> 5;
    for (int i = threadIdx.x; i < words; i += blockDim.x) in_query[i] = 0u;
    __syncthreads();
    for (i64 p = q_indptr[q] + threadIdx.x; p < q_indptr[q + 1]; p += blockDim.x) {
        const int t = q_terms[p];
        if (t >= 0 && t < vocab) atomicOr(in_query + (t >> 5), 1u << (t & 31));
    }
    __syncthreads();
    const double sc = scale[q], inv = inv_scale[q];
    const float* row = qd + (i64)q * stride_qd;
    const int c_end = min(C, (blockIdx.x + 1) * cta_cells);
    for (int c = blockIdx.x * cta_cells + warp; c < c_end; c += warps) {
        const i64 cell = (i64)q * C + c;
        const i64 doc = cand[cell];
        float s = 0.f;
        if (doc >= 0 && doc < n_docs) {        // warp-uniform
            const i64 a = indptr[doc], b = indptr[doc + 1];
            i64 acc = 0;                       // lsr.search.kernels.fixed.to_fixed: (w_query * w_doc * scale) -> int64
            for (i64 p = a + lane; p < b; p += 32) {
                const int t = terms[p];
                if ((in_query[t >> 5] >> (t & 31)) & 1u) acc += (i64)((double)row[t] * (double)weights[p] * sc);
            }
            #pragma unroll
            for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
            s = (float)((double)acc * inv);
        }
        if (lane == 0) out[cell] = s;
    }
}
