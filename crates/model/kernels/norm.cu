// RMSNorm variants, f32 inside, one rounding to bf16 at the end (the reference's order:
// x.float() normalised, times the weight in f32, cast back).
// grid: rows; block: 256 (a multiple of 32).

// y = x · rsqrt(mean(x²) + eps) · w           (zero_centred = 0: Qwen3-Next's q/k norms use it too)
// y = x · rsqrt(mean(x²) + eps) · (1 + w)     (zero_centred = 1: Qwen3.5 / 3.6 decoder and q/k norms)
// Rows of `n` elements, `stride` apart (q/k norms run per head inside a wider row).
// x and y may be one buffer (the per-head q / k norms run in place), so neither is __restrict__.
extern "C" __global__ void rms_norm(const bf16* x, const bf16* __restrict__ w, bf16* y,
                                    int n, long long stride, float eps, int zero_centred) {
    __shared__ float scratch[32];
    const bf16* xr = x + blockIdx.x * stride;
    bf16* yr = y + blockIdx.x * stride;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float v = bf2f(xr[i]);
        ss += v * v;
    }
    const float inv = rsqrtf(block_sum(ss, scratch) / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float wi = bf2f(w[i]);
        if (zero_centred) wi += 1.0f;
        yr[i] = f2bf(bf2f(xr[i]) * inv * wi);
    }
}

// The GDN output norm (RMSNormGated): y = round(w · round(x · rsqrt(mean(x²) + eps))) · silu(z),
// per value head (rows of `n` = head_v_dim), z the gate projection's row for that head.
extern "C" __global__ void rms_norm_gated(const bf16* __restrict__ x, const bf16* __restrict__ z,
                                          const bf16* __restrict__ w, bf16* __restrict__ y, int n, float eps) {
    __shared__ float scratch[32];
    const long long row = (long long)blockIdx.x * n;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float v = bf2f(x[row + i]);
        ss += v * v;
    }
    const float inv = rsqrtf(block_sum(ss, scratch) / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float normed = round_bf(bf2f(x[row + i]) * inv);
        float scaled = round_bf(bf2f(w[i]) * normed);
        y[row + i] = f2bf(scaled * silu(bf2f(z[row + i])));
    }
}
