// Embedding gather: out[t] = table[ids[t]] (bf16 rows). An id outside the table writes NaN,
// so a bad id shows as non-finite logits instead of reading out of bounds.
// grid: tokens; block: 256.
extern "C" __global__ void embed_gather(const bf16* __restrict__ table, const unsigned int* __restrict__ ids,
                                        bf16* __restrict__ out, int hidden, unsigned int vocab) {
    const int t = blockIdx.x;
    const unsigned int id = ids[t];
    bf16* row = out + (long long)t * hidden;
    if (id >= vocab) {
        for (int i = threadIdx.x; i < hidden; i += blockDim.x) row[i] = 0x7fc0u;
        return;
    }
    const bf16* src = table + (long long)id * hidden;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) row[i] = src[i];
}
