typedef long long i64;

// One CTA per row of keys [B, C]: the row's first n keys (n = C, or count[row] when HAS_COUNT: a gather buffer whose
// slots past the count are garbage) padded with -1 to a power of two, bitonic-sorted in shared memory (descending),
// and the first k written out (-1 past n). Keys are compared as int64, so equal keys are interchangeable and the
// output is the same whatever the schedule. Rows of a few thousand keys take a few microseconds each this way, where
// torch.topk runs a multi-block radix select and then a separate sort (docs/performance/search.md).
extern "C" __global__ void lsr_row_topk(const i64* __restrict__ keys, int C, const int* __restrict__ count,
                                        int has_count, int k, i64* __restrict__ out)
{
    extern __shared__ i64 s[];
    const i64 row = blockIdx.x;
    int n = C;
    if (has_count) n = min(n, max(count[row], 0));
    int N = 2;
    while (N < n) N <<= 1;
    const i64* src = keys + row * (i64)C;
    for (int i = threadIdx.x; i < N; i += blockDim.x) s[i] = i < n ? src[i] : -1;
    __syncthreads();
    const int half = N >> 1;
    for (int size = 2; size <= N; size <<= 1) {
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            // pair t of a stride below 32 stays in the 64 keys of pairs 32 (t / 32) .. + 31, and every such step
            // gives a warp the same pairs: the warp alone touched them since the last block-wide step, so a warp
            // barrier is enough there (57 of the 78 steps of 4,096 keys)
            if (stride >= 32) __syncthreads(); else __syncwarp();
            for (int t = threadIdx.x; t < half; t += blockDim.x) {
                const int i = 2 * t - (t & (stride - 1)), j = i + stride;   // the pair's lower and upper slot
                const i64 a = s[i], b = s[j];
                const bool descending = (i & size) == 0;                    // the last merge (size = N): all
                if (descending ? a < b : a > b) {
                    s[i] = b;
                    s[j] = a;
                }
            }
        }
    }
    __syncthreads();
    i64* dst = out + row * (i64)k;
    for (int i = threadIdx.x; i < k; i += blockDim.x) dst[i] = i < N ? s[i] : -1;
}
