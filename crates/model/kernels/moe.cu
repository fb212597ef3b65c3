// Mixture-of-experts pieces (Qwen3.5 / 3.6 MoE, Qwen3-Next): the router's top-k, expert GEMVs
// over the chosen experts only, and the weighted combine.

// Router: softmax over the experts in f32, the k largest (ties: the lower id), renormalised
// to sum 1 when `renorm` (norm_topk_prob), the weights rounded to bf16 as the reference casts
// them. logits [T][E] f32 (the router GEMV's f32 output), rounded to bf16 here as the bf16
// router's output is (the CPU engine and transformers). ids / weights [T][k].
// grid: T; block: 256. E ≤ 1024, k ≤ 32.
extern "C" __global__ void moe_topk(const float* __restrict__ logits, int* __restrict__ ids, float* __restrict__ weights,
                                    int experts, int k, int renorm) {
    __shared__ float p[1024];
    __shared__ float scratch[32];
    __shared__ float best_v[32];
    __shared__ int best_i[32];
    const int t = blockIdx.x;
    const float* row = logits + (long long)t * experts;
    float mx = -INFINITY;
    for (int e = threadIdx.x; e < experts; e += blockDim.x) mx = fmaxf(mx, round_bf(row[e]));
    // block max through the same scratch as block_sum
    mx = warp_max(mx);
    if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = mx;
    __syncthreads();
    mx = -INFINITY;
    for (int w = 0; w < (int)(blockDim.x >> 5); ++w) mx = fmaxf(mx, scratch[w]);
    __syncthreads();
    float sum = 0.0f;
    for (int e = threadIdx.x; e < experts; e += blockDim.x) {
        p[e] = expf(round_bf(row[e]) - mx);
        sum += p[e];
    }
    sum = block_sum(sum, scratch);
    for (int e = threadIdx.x; e < experts; e += blockDim.x) p[e] /= sum;
    __syncthreads();
    // k rounds of a block argmax; the winner is struck out.
    float chosen_sum = 0.0f;
    for (int s = 0; s < k; ++s) {
        float v = -1.0f;
        int id = 0x7fffffff;
        for (int e = threadIdx.x; e < experts; e += blockDim.x)
            if (p[e] > v || (p[e] == v && e < id)) { v = p[e]; id = e; }
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, v, o);
            const int oi = __shfl_xor_sync(0xffffffffu, id, o);
            if (ov > v || (ov == v && oi < id)) { v = ov; id = oi; }
        }
        if ((threadIdx.x & 31) == 0) { best_v[threadIdx.x >> 5] = v; best_i[threadIdx.x >> 5] = id; }
        __syncthreads();
        if (threadIdx.x == 0) {
            float bv = best_v[0];
            int bi = best_i[0];
            for (int w = 1; w < (int)(blockDim.x >> 5); ++w)
                if (best_v[w] > bv || (best_v[w] == bv && best_i[w] < bi)) { bv = best_v[w]; bi = best_i[w]; }
            ids[t * k + s] = bi;
            weights[t * k + s] = bv;
            p[bi] = -2.0f;
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        for (int s = 0; s < k; ++s) chosen_sum += weights[t * k + s];
        for (int s = 0; s < k; ++s) {
            const float w = renorm ? weights[t * k + s] / chosen_sum : weights[t * k + s];
            weights[t * k + s] = round_bf(w);
        }
    }
}

// y[p][n] = W[ids[p]][n] · x_p for each (token, slot) pair p = t·k + s, W expert-major
// [E][n_out][k_in] (bf16: moe_gemv; FP8 with block scales: moe_gemv_fp8, a stacked Fp8Weights
// whose row e·n_out + n is expert e's row n); x_p is x[p] when `x_per_pair` (the down
// projection reads each pair's own activation) else x[t] (gate/up read the token's). One warp
// per (pair, feature).
// grid: (pairs, ceil(n_out / 8)); block: 256. Pairs on x: T·top_k passes grid y's 65535 at
// 8192 tokens of a top-8 model.
template <typename Experts>
__device__ __forceinline__ void moe_rows(const Experts& W, const int* __restrict__ ids, const bf16* __restrict__ x,
                                         int x_per_pair, bf16* __restrict__ y, int n_out, int k_in, int top_k) {
    const int lane = threadIdx.x & 31;
    const int n = blockIdx.y * 8 + (threadIdx.x >> 5);
    const int pair = blockIdx.x;
    if (n >= n_out) return;
    const long long row = (long long)ids[pair] * n_out + n;
    const bf16* xr = x + (long long)(x_per_pair ? pair : pair / top_k) * k_in;
    float s = 0.0f;
    for (int c = lane; c < k_in; c += 32) s = fmaf(W.at(row, k_in, c), bf2f(xr[c]), s);
    s = warp_sum(s);
    if (lane == 0) y[(long long)pair * n_out + n] = f2bf(s);
}

extern "C" __global__ void moe_gemv(const bf16* __restrict__ W, const int* __restrict__ ids, const bf16* __restrict__ x,
                                    int x_per_pair, bf16* __restrict__ y, int n_out, int k_in, int top_k) {
    const Bf16At w = {W};
    moe_rows(w, ids, x, x_per_pair, y, n_out, k_in, top_k);
}

extern "C" __global__ void moe_gemv_fp8(const unsigned char* __restrict__ Q, const float* __restrict__ S,
                                        const int* __restrict__ band, int gc, const int* __restrict__ ids,
                                        const bf16* __restrict__ x, int x_per_pair, bf16* __restrict__ y, int n_out,
                                        int k_in, int top_k) {
    const Fp8At w = {{Q, S, band, gc}};
    moe_rows(w, ids, x, x_per_pair, y, n_out, k_in, top_k);
}

// out[t][i] = round(Σ_s round(w[t][s] · y[t·k + s][i])), summed in ascending expert id (the
// CPU engine's order: it runs expert by expert), so the roundings match.
// grid: ceil(T·hidden / 256); block: 256. top_k ≤ 32.
extern "C" __global__ void moe_combine(const bf16* __restrict__ y, const int* __restrict__ ids,
                                       const float* __restrict__ weights, bf16* __restrict__ out, int hidden,
                                       int top_k, long long n) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const long long t = i / hidden, c = i % hidden;
    int order[32];
    for (int s = 0; s < top_k; ++s) {
        int j = s;
        while (j > 0 && ids[t * top_k + order[j - 1]] > ids[t * top_k + s]) {
            order[j] = order[j - 1];
            --j;
        }
        order[j] = s;
    }
    float acc = 0.0f;
    for (int r = 0; r < top_k; ++r) {
        const int s = order[r];
        acc = round_bf(acc + round_bf(bf2f(y[(t * top_k + s) * hidden + c]) * weights[t * top_k + s]));
    }
    out[i] = f2bf(acc);
}

// The shared expert's gate: out[t][i] = round(x[t][i] · round(sigmoid(round(g[t])))), g the
// shared_expert_gate GEMV's f32 output per token, rounded as the bf16 linear's output is.
extern "C" __global__ void sigmoid_scale_rows(const bf16* __restrict__ x, const float* __restrict__ g,
                                             bf16* __restrict__ out, int hidden, long long n) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = f2bf(bf2f(x[i]) * round_bf(sigmoidf(round_bf(g[i / hidden]))));
}
