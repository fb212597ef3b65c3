// The gated delta rule, fused per layer: q/k L2 norms, the gates, the recurrence and the
// read-out, for T tokens in order (decode T = 1, MTP verify T ≤ 8 with per-token state slots,
// prefill any T: the sequential form, exact to the definition; model-spec §3.6).
//
// Inputs, after the conv: qkv [T][conv_dim] bf16 with q at [0, Hk·dk), k at [Hk·dk, 2·Hk·dk),
// v at [2·Hk·dk, conv_dim) (Qwen3-Next's GQA-interleaved projection is reordered to this at
// upload); a, b [T][Hv] bf16 (in_proj_a / in_proj_b); A_log, dt_bias [Hv] f32.
// State S [Hv][dv][dk] f32 (one value row contiguous over k: vLLM's layout, the transpose of
// HF's [dk][dv]). Output o [T][Hv][dv] bf16, rounded once.
// Math in f32 as HF-Q35 does it: beta = round_bf(sigmoid(b)); g = −exp(A_log)·softplus(a + dt_bias);
// q = l2norm(q)·dk^−½, k = l2norm(k) (x·rsqrt(Σx² + 1e−6)); per token
//   S ← S·exp(g);  δ = (v − Sk)·beta;  S ← S + δ ⊗ k;  o = S q.
// Value head h reads key head h / (Hv / Hk).
//
// Layout of the work: a block owns one value head and 16 of its value rows; each of its 4
// warps owns 4 rows, each lane ⌈dk/32⌉ columns of them, so the state lives in registers for
// all T tokens and is read and written once per call. dk ≤ 256; columns past dk and rows past
// dv are masked (the small test models have heads of 8, 12, 16).
// slots (nullable, MTP verify): the state after token t goes to slots + t·Hv·dv·dk (same
// layout) and `state` is left as it was before the pass; gdn_restore_slot then keeps the
// accepted prefix's state. Without slots the state is updated in place.
// trace (nullable, the state scope): [T][Hv][4] β, g and their inputs b, a per token and value
// head (written by the head's first block), then at T·Hv·4 the pass's sums [Hv][⌈dv / 16⌉][4 warps][3]: Σ S², Σ (S −
// S_before)² and the count of non-finite entries over each warp's rows of S after the pass
// (S_before: the state as the pass found it). The host adds them up in f64 per head. Off
// (null), it costs one uniform branch per token.
// grid: (Hv, ⌈dv / 16⌉); block: 128.

#define GDN_ROWS_PER_WARP 4
#define GDN_MAX_KPL 8   // dk / 32 ≤ 8

extern "C" __global__ void gdn_recurrent(const bf16* __restrict__ qkv, const bf16* __restrict__ a,
                                         const bf16* __restrict__ b, const float* __restrict__ A_log,
                                         const float* __restrict__ dt_bias, float* __restrict__ state,
                                         float* __restrict__ slots, float* __restrict__ trace,
                                         bf16* __restrict__ out, int tokens,
                                         int n_k_heads, int n_v_heads, int dk, int dv) {
    const int h = blockIdx.x;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int row0 = blockIdx.y * 16 + warp * GDN_ROWS_PER_WARP;
    const int kh = h / (n_v_heads / n_k_heads);
    const int key_dim = n_k_heads * dk;
    const int conv_dim = 2 * key_dim + n_v_heads * dv;
    const long long head_state = (long long)h * dv * dk;

    float s[GDN_ROWS_PER_WARP][GDN_MAX_KPL];
#pragma unroll
    for (int r = 0; r < GDN_ROWS_PER_WARP; ++r)
#pragma unroll
        for (int i = 0; i < GDN_MAX_KPL; ++i)
            s[r][i] = (i * 32 + lane < dk && row0 + r < dv) ? state[head_state + (long long)(row0 + r) * dk + i * 32 + lane] : 0.0f;

    const float neg_a = -expf(A_log[h]);
    const float scale = rsqrtf((float)dk);
    for (int t = 0; t < tokens; ++t) {
        const bf16* row = qkv + (long long)t * conv_dim;
        float q[GDN_MAX_KPL], k[GDN_MAX_KPL];
        float qq = 0.0f, kk = 0.0f;
#pragma unroll
        for (int i = 0; i < GDN_MAX_KPL; ++i) {
            q[i] = i * 32 + lane < dk ? bf2f(row[kh * dk + i * 32 + lane]) : 0.0f;
            k[i] = i * 32 + lane < dk ? bf2f(row[key_dim + kh * dk + i * 32 + lane]) : 0.0f;
            qq += q[i] * q[i];
            kk += k[i] * k[i];
        }
        const float qn = rsqrtf(warp_sum(qq) + 1e-6f) * scale;
        const float kn = rsqrtf(warp_sum(kk) + 1e-6f);
#pragma unroll
        for (int i = 0; i < GDN_MAX_KPL; ++i) {
            q[i] *= qn;
            k[i] *= kn;
        }
        const float b_in = bf2f(b[(long long)t * n_v_heads + h]);
        const float a_in = bf2f(a[(long long)t * n_v_heads + h]);
        const float beta = round_bf(sigmoidf(b_in));
        const float g = neg_a * softplusf(a_in + dt_bias[h]);
        const float decay = expf(g);
        if (trace && blockIdx.y == 0 && threadIdx.x == 0) {
            float* at = trace + ((long long)t * n_v_heads + h) * 4;
            at[0] = beta;
            at[1] = g;
            at[2] = b_in;
            at[3] = a_in;
        }
#pragma unroll
        for (int r = 0; r < GDN_ROWS_PER_WARP; ++r) {
            if (row0 + r >= dv) break;  // the same for the whole warp
            const float v = bf2f(row[2 * key_dim + h * dv + row0 + r]);
            float sk = 0.0f;
#pragma unroll
            for (int i = 0; i < GDN_MAX_KPL; ++i) {
                s[r][i] *= decay;
                sk = fmaf(s[r][i], k[i], sk);
            }
            const float delta = (v - warp_sum(sk)) * beta;
            float o = 0.0f;
#pragma unroll
            for (int i = 0; i < GDN_MAX_KPL; ++i) {
                s[r][i] = fmaf(k[i], delta, s[r][i]);
                o = fmaf(s[r][i], q[i], o);
            }
            o = warp_sum(o);
            if (lane == 0) out[((long long)t * n_v_heads + h) * dv + row0 + r] = f2bf(o);
        }
        if (slots) {
            float* slot = slots + (long long)t * n_v_heads * dv * dk + head_state;
#pragma unroll
            for (int r = 0; r < GDN_ROWS_PER_WARP; ++r)
#pragma unroll
                for (int i = 0; i < GDN_MAX_KPL; ++i)
                    if (i * 32 + lane < dk && row0 + r < dv) slot[(long long)(row0 + r) * dk + i * 32 + lane] = s[r][i];
        }
    }
    if (trace) {
        float ss = 0.0f, dd = 0.0f, bad = 0.0f;
#pragma unroll
        for (int r = 0; r < GDN_ROWS_PER_WARP; ++r)
#pragma unroll
            for (int i = 0; i < GDN_MAX_KPL; ++i)
                if (i * 32 + lane < dk && row0 + r < dv) {
                    const float x = s[r][i];
                    const float e = x - state[head_state + (long long)(row0 + r) * dk + i * 32 + lane];
                    ss = fmaf(x, x, ss);
                    dd = fmaf(e, e, dd);
                    bad += finite_f32(x) ? 0.0f : 1.0f;
                }
        ss = warp_sum(ss);
        dd = warp_sum(dd);
        bad = warp_sum(bad);
        if (lane == 0) {
            float* sums = trace + (long long)tokens * n_v_heads * 4 + (((long long)h * gridDim.y + blockIdx.y) * 4 + warp) * 3;
            sums[0] = ss;
            sums[1] = dd;
            sums[2] = bad;
        }
    }
    if (slots) return;
#pragma unroll
    for (int r = 0; r < GDN_ROWS_PER_WARP; ++r)
#pragma unroll
        for (int i = 0; i < GDN_MAX_KPL; ++i)
            if (i * 32 + lane < dk && row0 + r < dv) state[head_state + (long long)(row0 + r) * dk + i * 32 + lane] = s[r][i];
}

// After a verify pass: the state becomes the one after verified token `keep − 1` (the first
// `keep` tokens were accepted); keep = 0 leaves the state before the pass. n = Hv·dv·dk.
// grid: ceil(n / 256); block: 256.
extern "C" __global__ void gdn_restore_slot(float* __restrict__ state, const float* __restrict__ slots, int keep,
                                            long long n) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n && keep > 0) state[i] = slots[(long long)(keep - 1) * n + i];
}
