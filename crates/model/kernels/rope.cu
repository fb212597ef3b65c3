// Partial rotary embedding with interleaved mRoPE sections (Qwen3.5 / 3.6; Qwen3-Next is the
// case with one section), in place on q or k: the first `rotary_dim` of each head's dims
// rotate in rotate_half pairs (j, j + rotary_dim/2), the rest pass through.
//
// Frequency j (of rotary_dim/2) reads its position from the temporal, height or width ids:
// interleaved, j ≡ 1 (mod 3) below 3·sec_h is height, j ≡ 2 (mod 3) below 3·sec_w is width,
// every other j temporal. Text has the three ids equal, which is plain RoPE.
// inv_freq[j] = 1 / theta^(2j / rotary_dim) comes from the host, computed once by the CPU
// engine's own expression: a GPU's powf may differ from the CPU's by an ulp, which at long
// positions moves the angle by several bf16 steps of cos / sin.
// cos / sin are computed in f32 and rounded to bf16 (the reference casts them to the
// activation dtype), each product and the sum rounded.
//
// grid: (tokens, heads); block: rotary_dim / 2 threads (≤ 1024). Rows `token_stride` apart,
// heads `head_stride` apart (q shares its row with the output gate).
extern "C" __global__ void rope_mrope(bf16* __restrict__ x, const int* __restrict__ pos_t, const int* __restrict__ pos_h,
                                      const int* __restrict__ pos_w, long long token_stride, int head_stride,
                                      int rotary_dim, const float* __restrict__ inv_freq, int sec_h, int sec_w) {
    const int t = blockIdx.x, h = blockIdx.y, j = threadIdx.x;
    const int half = rotary_dim / 2;
    if (j >= half) return;
    int pos = pos_t[t];
    if (j % 3 == 1 && j < 3 * sec_h) pos = pos_h[t];
    if (j % 3 == 2 && j < 3 * sec_w) pos = pos_w[t];
    const float angle = (float)pos * inv_freq[j];
    const float c = round_bf(cosf(angle)), s = round_bf(sinf(angle));
    bf16* row = x + t * token_stride + (long long)h * head_stride;
    const float a = bf2f(row[j]), b = bf2f(row[j + half]);
    row[j] = f2bf(round_bf(a * c) - round_bf(b * s));
    row[j + half] = f2bf(round_bf(b * c) + round_bf(a * s));
}
