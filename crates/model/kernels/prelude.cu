// Shared by every kernel file: prepended to each source before NVRTC compiles it, so no file
// includes a header (NVRTC then needs only libnvrtc and its builtins, no CUDA headers).
//
// bf16 travels as its raw 16 bits (`bf16` = unsigned short). Conversions round to nearest
// even, as torch and the CPU engine do; NaN stays NaN.

typedef unsigned short bf16;

// No <math.h> / <cuda_runtime.h> here: the constants and tests the kernels need.
#define INFINITY __int_as_float(0x7f800000)
__device__ __forceinline__ bool finite_f32(float x) { return (__float_as_uint(x) & 0x7f800000u) != 0x7f800000u; }

__device__ __forceinline__ float bf2f(bf16 v) { return __uint_as_float(((unsigned int)v) << 16); }

__device__ __forceinline__ bf16 f2bf(float f) {
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0u) {
        return (bf16)((u >> 16) | 0x0040u);  // quiet NaN
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    return (bf16)(u >> 16);
}

// An FP8 e4m3 code (Qwen's FP8 checkpoints: 1 sign, 4 exponent bits biased by 7, 3 mantissa
// bits, no infinities; 0x7f / 0xff are NaN, which the loader refuses) as its exact f32 value.
// Normal codes move their exponent and mantissa into f32 position and rebias by 120; the
// subnormals are m · 2^-9. No f32 subnormal is made, so flush-to-zero cannot change it.
__device__ __forceinline__ float e4m3_to_f32(unsigned int c) {
    const unsigned int em = c & 0x7fu;
    const float v = (em >> 3) ? __uint_as_float((em << 20) + (120u << 23)) : (float)em * 0.001953125f;
    return (c & 0x80u) ? -v : v;
}

// FP8 weights on a device: codes [rows][k], and per row the index of its row of block scales
// (`gc` f32 scales, one per 128 columns). The host may stack rows cut from several checkpoint
// matrices (Qwen3-Next's per-head pieces of in_proj_qkvz, the experts of a MoE block), each
// row keeping its own matrix's scales: the weight at (r, c) is e4m3(Q[r][c]) · S[band[r]][c / 128],
// rounded once, as transformers dequantises.
struct Fp8Weights {
    const unsigned char* q;
    const float* s;
    const int* band;
    int gc;
};

__device__ __forceinline__ float fp8_at(const Fp8Weights& w, long long row, int k, int c) {
    return e4m3_to_f32(w.q[row * k + c]) * w.s[(long long)w.band[row] * w.gc + (c >> 7)];
}

// Weight (row, c) of a [rows][k] matrix as f32, for the kernels that read weights one at a time
// (the tiled GEMM, the expert GEMV), templated over these two.
struct Bf16At {
    const bf16* W;
    __device__ __forceinline__ float at(long long row, int k, int c) const { return bf2f(W[row * k + c]); }
};

struct Fp8At {
    Fp8Weights w;
    __device__ __forceinline__ float at(long long row, int k, int c) const { return fp8_at(w, row, k, c); }
};

// Rounds through bf16 (a cast point of the bf16 reference).
__device__ __forceinline__ float round_bf(float f) { return bf2f(f2bf(f)); }

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); `scratch` holds 32 floats.
// Every thread gets the total.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float t = lane < warps ? scratch[lane] : 0.0f;
    return warp_sum(t);
}

__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float softplusf(float x) { return x > 20.0f ? x : log1pf(expf(x)); }
