// Decode and MTP-verify GEMV: y[r][n] = Σ_k W[n][k] · x[r][k] for rows r < R ≤ 8, bf16
// activations, f32 accumulation; weights in bf16 (gemv_bf16) or FP8 with block scales
// (gemv_fp8, dequantised in registers). One warp per output feature streams its weight row
// once (16 bytes of bf16 or 8 bytes of FP8 a lane a step: 8 weights) and serves all R
// activation rows from registers: a verify pass of K+1 tokens reads the weights once, as one
// token does. Both sum in the same order: lane l takes the pieces of 8 at l, l + 32, …, each
// weight times its activation by fmaf in column order, then the warp's butterfly.
// Requires k % 8 == 0 and rows aligned to their loads (every projection width of the models
// is a multiple of 64).
// grid: ceil(n_out / 8); block: 256 (8 warps).
// y_f32 (logits, router) and/or y_bf16 (activations, rounded once) may be null.

#define GEMV_MAX_ROWS 8

// bf16 rows: a piece of 8 is one 16-byte load, widened by shifts.
struct Bf16Piece {
    const bf16* W;
    __device__ __forceinline__ void load(int n, int k, int c, float wf[8]) const {
        const uint4 wv = reinterpret_cast<const uint4*>(W + (long long)n * k)[c];
        wf[0] = __uint_as_float(wv.x << 16); wf[1] = __uint_as_float(wv.x & 0xffff0000u);
        wf[2] = __uint_as_float(wv.y << 16); wf[3] = __uint_as_float(wv.y & 0xffff0000u);
        wf[4] = __uint_as_float(wv.z << 16); wf[5] = __uint_as_float(wv.z & 0xffff0000u);
        wf[6] = __uint_as_float(wv.w << 16); wf[7] = __uint_as_float(wv.w & 0xffff0000u);
    }
};

// FP8 rows: a piece of 8 is one 8-byte load of codes, each times its block's scale (a piece
// never straddles two blocks: 128 is 16 pieces).
struct Fp8Piece {
    Fp8Weights w;
    __device__ __forceinline__ void load(int n, int k, int c, float wf[8]) const {
        const uint2 q = reinterpret_cast<const uint2*>(w.q + (long long)n * k)[c];
        const float s = w.s[(long long)w.band[n] * w.gc + (c >> 4)];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            wf[j] = e4m3_to_f32((q.x >> (8 * j)) & 0xffu) * s;
            wf[4 + j] = e4m3_to_f32((q.y >> (8 * j)) & 0xffu) * s;
        }
    }
};

template <typename Piece>
__device__ __forceinline__ void gemv_rows(const Piece& W, const bf16* __restrict__ x, float* __restrict__ y_f32,
                                          bf16* __restrict__ y_bf16, int n_out, int k, int rows) {
    const int lane = threadIdx.x & 31;
    const int n = blockIdx.x * 8 + (threadIdx.x >> 5);
    if (n >= n_out) return;
    float acc[GEMV_MAX_ROWS];
#pragma unroll
    for (int r = 0; r < GEMV_MAX_ROWS; ++r) acc[r] = 0.0f;
    const int chunks = k / 8;
    for (int c = lane; c < chunks; c += 32) {
        float wf[8];
        W.load(n, k, c, wf);
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

extern "C" __global__ void gemv_bf16(const bf16* __restrict__ W, const bf16* __restrict__ x, float* __restrict__ y_f32,
                                     bf16* __restrict__ y_bf16, int n_out, int k, int rows) {
    const Bf16Piece w = {W};
    gemv_rows(w, x, y_f32, y_bf16, n_out, k, rows);
}

// Q [n_out][k] e4m3 codes, S and band as Fp8Weights (prelude.cu) describes.
extern "C" __global__ void gemv_fp8(const unsigned char* __restrict__ Q, const float* __restrict__ S,
                                    const int* __restrict__ band, int gc, const bf16* __restrict__ x,
                                    float* __restrict__ y_f32, bf16* __restrict__ y_bf16, int n_out, int k, int rows) {
    const Fp8Piece w = {{Q, S, band, gc}};
    gemv_rows(w, x, y_f32, y_bf16, n_out, k, rows);
}
