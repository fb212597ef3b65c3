// Elementwise passes in bf16 with the reference's roundings. grid: ceil(n / 256); block: 256.

// The residual add: out = round(x + y) (out may alias x).
extern "C" __global__ void add_bf16(const bf16* x, const bf16* __restrict__ y, bf16* out, long long n) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = f2bf(bf2f(x[i]) + bf2f(y[i]));
}

// SwiGLU over fused gate/up rows [rows][2·inter] (gate first): out[r][i] = round(round(silu(g)) · u).
extern "C" __global__ void swiglu(const bf16* __restrict__ gate_up, bf16* __restrict__ out, int inter, long long n) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const long long r = i / inter, c = i % inter;
    const float g = bf2f(gate_up[r * 2 * inter + c]);
    const float u = bf2f(gate_up[r * 2 * inter + inter + c]);
    out[i] = f2bf(round_bf(silu(g)) * u);
}

// f32 → bf16 (logits of the last position kept in f32 elsewhere; projections rounded once).
extern "C" __global__ void f32_to_bf16(const float* __restrict__ x, bf16* __restrict__ out, long long n) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = f2bf(x[i]);
}

// Two row blocks side by side: out[r] = [a[r] (na), b[r] (nb)] (the MTP layer's fc input:
// the normed embedding and the normed hidden state).
extern "C" __global__ void concat_rows(const bf16* __restrict__ a, const bf16* __restrict__ b, bf16* __restrict__ out,
                                       int na, int nb, long long n) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const long long w = na + nb, r = i / w, c = i % w;
    out[i] = c < na ? a[r * na + c] : b[r * nb + (c - na)];
}

// Counts non-finite values (the loop alarm and the state scope read it). One atomic per block.
extern "C" __global__ void count_nonfinite_f32(const float* __restrict__ x, long long n, unsigned int* __restrict__ count) {
    __shared__ unsigned int block_count;
    if (threadIdx.x == 0) block_count = 0;
    __syncthreads();
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n && !finite_f32(x[i])) atomicAdd(&block_count, 1u);
    __syncthreads();
    if (threadIdx.x == 0 && block_count) atomicAdd(count, block_count);
}
