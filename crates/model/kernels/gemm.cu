// Prefill GEMM where cuBLASLt is absent: Y[m][n] = Σ_k X[m][k] · W[n][k] (X · Wᵀ, X row-major
// bf16, f32 accumulation), W in bf16 (gemm_bf16_tiled) or FP8 with block scales (gemm_fp8_tiled,
// each weight dequantised to f32 as the tile is loaded). Tiles of 64 × 64 outputs, 16 deep,
// through shared memory; each of the 256 threads owns a 4 × 4 block of the tile. Any m, n, k
// (edges masked).
// grid: (ceil(n / 64), ceil(m / 64)); block: 256.

#define TILE 64
#define DEPTH 16

template <typename Matrix>
__device__ __forceinline__ void gemm_tiled(const bf16* __restrict__ X, const Matrix& W, float* __restrict__ y_f32,
                                           bf16* __restrict__ y_bf16, int m, int n, int k) {
    __shared__ float xs[DEPTH][TILE + 1];
    __shared__ float ws[DEPTH][TILE + 1];
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const int row0 = blockIdx.y * TILE, col0 = blockIdx.x * TILE;
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;
    for (int k0 = 0; k0 < k; k0 += DEPTH) {
        // 64 rows × 16 deep = 1024 values per operand: 4 per thread.
        for (int e = threadIdx.x; e < TILE * DEPTH; e += blockDim.x) {
            const int r = e / DEPTH, d = e % DEPTH;
            const int gk = k0 + d;
            const int gm = row0 + r, gn = col0 + r;
            xs[d][r] = (gm < m && gk < k) ? bf2f(X[(long long)gm * k + gk]) : 0.0f;
            ws[d][r] = (gn < n && gk < k) ? W.at(gn, k, gk) : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int d = 0; d < DEPTH; ++d) {
            float a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) a[i] = xs[d][ty * 4 + i];
#pragma unroll
            for (int j = 0; j < 4; ++j) b[j] = ws[d][tx * 4 + j];
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int gm = row0 + ty * 4 + i;
        if (gm >= m) continue;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int gn = col0 + tx * 4 + j;
            if (gn >= n) continue;
            if (y_f32) y_f32[(long long)gm * n + gn] = acc[i][j];
            if (y_bf16) y_bf16[(long long)gm * n + gn] = f2bf(acc[i][j]);
        }
    }
}

extern "C" __global__ void gemm_bf16_tiled(const bf16* __restrict__ X, const bf16* __restrict__ W,
                                           float* __restrict__ y_f32, bf16* __restrict__ y_bf16, int m, int n, int k) {
    const Bf16At w = {W};
    gemm_tiled(X, w, y_f32, y_bf16, m, n, k);
}

// Q [n][k] e4m3 codes, S and band as Fp8Weights (prelude.cu) describes.
extern "C" __global__ void gemm_fp8_tiled(const bf16* __restrict__ X, const unsigned char* __restrict__ Q,
                                          const float* __restrict__ S, const int* __restrict__ band, int gc,
                                          float* __restrict__ y_f32, bf16* __restrict__ y_bf16, int m, int n, int k) {
    const Fp8At w = {{Q, S, band, gc}};
    gemm_tiled(X, w, y_f32, y_bf16, m, n, k);
}
