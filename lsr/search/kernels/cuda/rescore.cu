typedef long long i64;

extern "C" __global__ void lsr_rescore(const i64* __restrict__ indptr, const int* __restrict__ terms,
                                       const float* __restrict__ weights, const float* __restrict__ qd,
                                       int stride_qd, const double* __restrict__ scale,
                                       const double* __restrict__ inv_scale, const i64* __restrict__ cand,
                                       int C, int n_cells, int n_docs, float* __restrict__ out)
{
    const int cell = blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (cell >= n_cells) return;
    const int q = cell / C;
    const i64 doc = cand[cell];
    float s = 0.f;
    if (doc >= 0 && doc < n_docs) {            // warp-uniform
        const i64 a = indptr[doc], b = indptr[doc + 1];
        const double sc = scale[q];
        const float* row = qd + (i64)q * stride_qd;
        i64 acc = 0;                           // lsr.search.kernels.fixed.to_fixed: (w_query * w_doc * scale) -> int64
        for (i64 p = a + lane; p < b; p += 32) acc += (i64)((double)row[terms[p]] * (double)weights[p] * sc);
        #pragma unroll
        for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
        s = (float)((double)acc * inv_scale[q]);
    }
    if (lane == 0) out[cell] = s;
}
