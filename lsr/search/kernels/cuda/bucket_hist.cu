typedef long long i64;

#define BINS 4096
#ifndef KEYS_PER_THREAD
#define KEYS_PER_THREAD 16
#endif

// The histogram of one level of lsr.search.kernels.select (its _hist_kernel, in CUDA): the bins of a row's keys
// (level 1: bits 61..50; level 2: bits 49..38 of the keys whose bits 61..50 equal pick[row]) counted in shared memory
// first and added to the row's global histogram once per non-empty bin. The keys of one row crowd into a few bins
// (the scores near the k-th), so each key's own global atomic, as the Triton kernel does it, queues on a handful of
// addresses; here the lanes of a warp that share a bin add once (__match_any_sync) and a CTA once per bin.
// Counts are integers: the same histogram in any order.
extern "C" __global__ void lsr_bucket_hist(const i64* __restrict__ keys, int C, const i64* __restrict__ pick,
                                           int level2, int* __restrict__ hist)
{
    __shared__ int h[BINS];
    const i64 row = blockIdx.x;
    for (int d = threadIdx.x; d < BINS; d += blockDim.x) h[d] = 0;
    __syncthreads();
    const i64 p1 = level2 ? pick[row] : 0;
    const i64* src = keys + row * (i64)C;
    const int start = blockIdx.y * blockDim.x * KEYS_PER_THREAD + threadIdx.x;
    #pragma unroll 4
    for (int j = 0; j < KEYS_PER_THREAD; ++j) {          // trip count uniform in the warp: __match_any_sync below
        const int i = start + j * blockDim.x;
        const i64 key = i < C ? src[i] : -1;
        bool ok = key >= 0;
        if (level2) ok = ok && (key >> 50) == p1;
        const int d = ok ? (int)((level2 ? key >> 38 : key >> 50) & (BINS - 1)) : -1;
        const unsigned peers = __match_any_sync(0xffffffffu, d);
        if (d >= 0 && (threadIdx.x & 31) == __ffs(peers) - 1) atomicAdd(h + d, __popc(peers));
    }
    __syncthreads();
    int* dst = hist + row * BINS;
    for (int d = threadIdx.x; d < BINS; d += blockDim.x)
        if (h[d]) atomicAdd(dst + d, h[d]);
}
