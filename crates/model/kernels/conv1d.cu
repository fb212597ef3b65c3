// The GDN layer's causal depthwise conv (kernel K, no bias) and SiLU, over the q/k/v channels.
// The conv state holds each channel's last K−1 inputs, oldest first: state[c][0..K−1).

// Decode / verify: T ≤ 8 tokens in order, one thread per channel, the window in registers.
// With slots (MTP verify) the window after token t goes to slots[t] and the state is left as
// before the pass (conv1d_restore_slot keeps the accepted prefix's); without, the state ends
// as the window after the last token.
// grid: ceil(channels / 256); block: 256.
#define CONV_MAX_K 8

extern "C" __global__ void conv1d_decode(const bf16* __restrict__ x, bf16* __restrict__ state,
                                         const bf16* __restrict__ w, bf16* __restrict__ y,
                                         bf16* __restrict__ slots, int tokens, int channels, int kernel) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= channels || kernel > CONV_MAX_K) return;
    float win[CONV_MAX_K];
    float wk[CONV_MAX_K];
    for (int i = 0; i < kernel - 1; ++i) win[i] = bf2f(state[(long long)c * (kernel - 1) + i]);
    for (int i = 0; i < kernel; ++i) wk[i] = bf2f(w[(long long)c * kernel + i]);
    for (int t = 0; t < tokens; ++t) {
        const float xt = bf2f(x[(long long)t * channels + c]);
        float s = 0.0f;
        for (int i = 0; i < kernel - 1; ++i) s = fmaf(wk[i], win[i], s);
        s = fmaf(wk[kernel - 1], xt, s);
        y[(long long)t * channels + c] = f2bf(silu(round_bf(s)));
        for (int i = 0; i + 1 < kernel - 1; ++i) win[i] = win[i + 1];
        if (kernel > 1) win[kernel - 2] = xt;
        if (slots) {
            bf16* slot = slots + ((long long)t * channels + c) * (kernel - 1);
            for (int i = 0; i < kernel - 1; ++i) slot[i] = f2bf(win[i]);
        }
    }
    if (slots) return;
    for (int i = 0; i < kernel - 1; ++i) state[(long long)c * (kernel - 1) + i] = f2bf(win[i]);
}

// After a verify pass: the conv state becomes slot keep − 1 (keep = 0: unchanged).
// n = channels · (K − 1). grid: ceil(n / 256); block: 256.
extern "C" __global__ void conv1d_restore_slot(bf16* __restrict__ state, const bf16* __restrict__ slots, int keep,
                                               long long n) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n && keep > 0) state[i] = slots[(long long)(keep - 1) * n + i];
}

// Prefill: y[t][c] over all tokens at once (one thread per (token, channel)), inputs before
// the first token read from the state. The state is not written here: conv1d_save_state
// runs after, once every y has read it.
// grid: (tokens, ceil(channels / 256)); block: 256. Tokens on x: grid y stops at 65535.
extern "C" __global__ void conv1d_prefill(const bf16* __restrict__ x, const bf16* __restrict__ state,
                                          const bf16* __restrict__ w, bf16* __restrict__ y, int tokens,
                                          int channels, int kernel) {
    const int c = blockIdx.y * blockDim.x + threadIdx.x;
    const int t = blockIdx.x;
    if (c >= channels || t >= tokens) return;
    float s = 0.0f;
    for (int i = 0; i < kernel; ++i) {
        const int src = t - (kernel - 1) + i;  // < 0: from the state
        const float v = src >= 0 ? bf2f(x[(long long)src * channels + c])
                                 : bf2f(state[(long long)c * (kernel - 1) + (kernel - 1 + src)]);
        s = fmaf(bf2f(w[(long long)c * kernel + i]), v, s);
    }
    y[(long long)t * channels + c] = f2bf(silu(round_bf(s)));
}

// The state after `tokens` inputs: the last K−1 of [state, x]. In ascending order each read
// is at or ahead of the write, so one thread per channel updates in place.
// grid: ceil(channels / 256); block: 256.
extern "C" __global__ void conv1d_save_state(const bf16* __restrict__ x, bf16* __restrict__ state, int tokens,
                                             int channels, int kernel) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= channels) return;
    const int keep = kernel - 1;
    bf16* st = state + (long long)c * keep;
    for (int j = 0; j < keep; ++j) {
        const int src = tokens + j;  // index into [state (keep), x (tokens)]
        st[j] = src < keep ? st[src] : x[(long long)(src - keep) * channels + c];
    }
}
