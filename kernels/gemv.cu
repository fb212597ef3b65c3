// Decode and MTP-verify GEMV: y[r][n] = Σ_k W[n][k] · x[r][k] for rows r < R ≤ 8, bf16 weights
// and activations, f32 accumulation. One warp per output feature streams its weight row once
// (16-byte loads, 8 values a lane) and serves all R activation rows from registers: a verify
// pass of K+1 tokens reads the weights once, as one token does.
// Requires k % 8 == 0 and 16-byte-aligned rows (every projection width of the models is a
// multiple of 64).
// grid: ceil(n_out / 8); block: 256 (8 warps).
// y_f32 (logits, router) and/or y_bf16 (activations, rounded once) may be null.

#define GEMV_MAX_ROWS 8

extern "C" __global__ void gemv_bf16(const bf16* __restrict__ W, const bf16* __restrict__ x, float* __restrict__ y_f32,
                                     bf16* __restrict__ y_bf16, int n_out, int k, int rows) {
    const int lane = threadIdx.x & 31;
    const int n = blockIdx.x * 8 + (threadIdx.x >> 5);
    if (n >= n_out) return;
    float acc[GEMV_MAX_ROWS];
#pragma unroll
    for (int r = 0; r < GEMV_MAX_ROWS; ++r) acc[r] = 0.0f;
    const uint4* wrow = reinterpret_cast<const uint4*>(W + (long long)n * k);
    const int chunks = k / 8;
    for (int c = lane; c < chunks; c += 32) {
        const uint4 wv = wrow[c];
        float wf[8];
        wf[0] = __uint_as_float(wv.x << 16); wf[1] = __uint_as_float(wv.x & 0xffff0000u);
        wf[2] = __uint_as_float(wv.y << 16); wf[3] = __uint_as_float(wv.y & 0xffff0000u);
        wf[4] = __uint_as_float(wv.z << 16); wf[5] = __uint_as_float(wv.z & 0xffff0000u);
        wf[6] = __uint_as_float(wv.w << 16); wf[7] = __uint_as_float(wv.w & 0xffff0000u);
#pragma unroll
        for (int r = 0; r < GEMV_MAX_ROWS; ++r) {
            if (r < rows) {
                const uint4 xv = reinterpret_cast<const uint4*>(x + (long long)r * k)[c];
                float s = acc[r];
                s = fmaf(wf[0], __uint_as_float(xv.x << 16), s);
                s = fmaf(wf[1], __uint_as_float(xv.x & 0xffff0000u), s);
                s = fmaf(wf[2], __uint_as_float(xv.y << 16), s);
                s = fmaf(wf[3], __uint_as_float(xv.y & 0xffff0000u), s);
                s = fmaf(wf[4], __uint_as_float(xv.z << 16), s);
                s = fmaf(wf[5], __uint_as_float(xv.z & 0xffff0000u), s);
                s = fmaf(wf[6], __uint_as_float(xv.w << 16), s);
                s = fmaf(wf[7], __uint_as_float(xv.w & 0xffff0000u), s);
                acc[r] = s;
            }
        }
    }
#pragma unroll
    for (int r = 0; r < GEMV_MAX_ROWS; ++r) {
        if (r < rows) {
            const float v = warp_sum(acc[r]);
            if (lane == 0) {
                if (y_f32) y_f32[(long long)r * n_out + n] = v;
                if (y_bf16) y_bf16[(long long)r * n_out + n] = f2bf(v);
            }
        }
    }
}
