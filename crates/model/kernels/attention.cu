// Full (gated) attention, GQA, for T query tokens against the layer's KV cache (decode T = 1,
// verify T ≤ 8, prefill any T): query t sits at position pos0 + t and sees keys 0 ..= pos0 + t
// (causal). The cache already holds this pass's keys and values (kv_append runs first).
// Cache layout [Hkv][l_max][hd] bf16. q rows are `q_token_stride` apart with heads
// `q_head_stride` apart (Qwen3.5's q_proj interleaves each head's query and output gate, so
// the gate is q + hd with the same strides).
// The roundings of the bf16 reference the CPU engine follows (transformers' eager path):
// score = round(round(q·k) · scale); softmax in f32 with the probabilities rounded; P·V in f32;
// then o = round(round(o) · round(sigmoid(gate))) when `gate` is not null.
//
// A block owns one (token, head); its 4 warps take every 4th key, each lane ⌈hd/32⌉ (≤ 8) dims
// (dims past hd masked: the small test models have heads of 16, 24, 48).
// Two passes over the keys: the softmax's max and sum (merged across warps), then the rounded
// probabilities times the values (summed across warps).
// grid: (T, Hq); block: 128. hd ≤ 256.

#define ATT_MAX_DPL 8
#define ATT_WARPS 4

__device__ __forceinline__ float attn_score(const float* qv, const bf16* kr, int hd, int lane, float scale) {
    float dot = 0.0f;
#pragma unroll
    for (int i = 0; i < ATT_MAX_DPL; ++i)
        if (i * 32 + lane < hd) dot = fmaf(qv[i], bf2f(kr[i * 32 + lane]), dot);
    return round_bf(round_bf(warp_sum(dot)) * scale);
}

extern "C" __global__ void attn_gqa(const bf16* __restrict__ q, long long q_token_stride, int q_head_stride,
                                    const bf16* __restrict__ gate, const bf16* __restrict__ kcache,
                                    const bf16* __restrict__ vcache, int l_max, bf16* __restrict__ out, int pos0,
                                    int n_heads, int n_kv_heads, int hd, float scale) {
    __shared__ float m_s[ATT_WARPS], l_s[ATT_WARPS];
    __shared__ float o_s[ATT_WARPS][ATT_MAX_DPL * 32];
    const int t = blockIdx.x, h = blockIdx.y;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int dpl = (hd + 31) / 32;
    const int kvh = h / (n_heads / n_kv_heads);
    const bf16* qr = q + t * q_token_stride + (long long)h * q_head_stride;
    float qv[ATT_MAX_DPL], acc[ATT_MAX_DPL];
#pragma unroll
    for (int i = 0; i < ATT_MAX_DPL; ++i) {
        qv[i] = i * 32 + lane < hd ? bf2f(qr[i * 32 + lane]) : 0.0f;
        acc[i] = 0.0f;
    }
    const bf16* kc = kcache + (long long)kvh * l_max * hd;
    const bf16* vc = vcache + (long long)kvh * l_max * hd;
    const int last = pos0 + t;

    // Pass 1: max and sum of exp over this warp's keys (rescaled as the max grows).
    float m = -INFINITY, l = 0.0f;
    for (int j = warp; j <= last; j += ATT_WARPS) {
        const float s = attn_score(qv, kc + (long long)j * hd, hd, lane, scale);
        const float m_new = fmaxf(m, s);
        l = l * expf(m - m_new) + expf(s - m_new);
        m = m_new;
    }
    if (lane == 0) {
        m_s[warp] = m;
        l_s[warp] = l;
    }
    __syncthreads();
    float mm = -INFINITY;
    for (int w = 0; w < ATT_WARPS; ++w) mm = fmaxf(mm, m_s[w]);
    float ll = 0.0f;
    for (int w = 0; w < ATT_WARPS; ++w)
        if (l_s[w] > 0.0f) ll += l_s[w] * expf(m_s[w] - mm);

    // Pass 2: the rounded probabilities times the values.
    for (int j = warp; j <= last; j += ATT_WARPS) {
        const float s = attn_score(qv, kc + (long long)j * hd, hd, lane, scale);
        const float p = round_bf(expf(s - mm) / ll);
        const bf16* vr = vc + (long long)j * hd;
#pragma unroll
        for (int i = 0; i < ATT_MAX_DPL; ++i)
            if (i * 32 + lane < hd) acc[i] = fmaf(p, bf2f(vr[i * 32 + lane]), acc[i]);
    }
#pragma unroll
    for (int i = 0; i < ATT_MAX_DPL; ++i)
        if (i * 32 + lane < hd) o_s[warp][i * 32 + lane] = acc[i];
    __syncthreads();
    if (warp != 0) return;
    bf16* orow = out + ((long long)t * n_heads + h) * hd;
    const bf16* gr = gate ? gate + t * q_token_stride + (long long)h * q_head_stride : nullptr;
    for (int i = 0; i < dpl; ++i) {
        const int d = i * 32 + lane;
        if (d >= hd) break;
        float o = 0.0f;
        for (int w = 0; w < ATT_WARPS; ++w) o += o_s[w][d];
        o = round_bf(o);
        if (gr) o = o * round_bf(sigmoidf(bf2f(gr[d])));
        orow[d] = f2bf(o);
    }
}

// Appends T tokens' keys and values (after the k norm and RoPE) at positions pos0 .. pos0+T−1.
// k / v rows `k_token_stride` / `v_token_stride` apart, heads hd apart.
// grid: (T, Hkv); block: hd (≤ 1024).
extern "C" __global__ void kv_append(const bf16* __restrict__ k, long long k_token_stride, const bf16* __restrict__ v,
                                     long long v_token_stride, bf16* __restrict__ kcache, bf16* __restrict__ vcache,
                                     int pos0, int hd, int l_max) {
    const int t = blockIdx.x, h = blockIdx.y, d = threadIdx.x;
    if (d >= hd) return;
    const long long dst = ((long long)h * l_max + pos0 + t) * hd + d;
    kcache[dst] = k[t * k_token_stride + (long long)h * hd + d];
    vcache[dst] = v[t * v_token_stride + (long long)h * hd + d];
}
