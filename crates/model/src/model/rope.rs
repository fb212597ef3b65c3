//! Partial NeoX-style rotary embedding (`rotate_half`) on the first `rotary_dim` dims of each
//! head. Qwen3.5's interleaved M-RoPE gives every frequency slot the same position for text
//! (the three position ids are equal), so it reduces exactly to this 1-D form.

use super::config::RopeConfig;
use super::cpu::tensor::Precision;

pub struct Rope {
    inv_freq: Vec<f32>,
    rotary_dim: usize,
}

impl Rope {
    pub fn new(cfg: &RopeConfig) -> Self {
        let dim = cfg.rotary_dim;
        let base = cfg.theta as f32;
        // transformers: 1 / base ** (arange(0, dim, 2).float() / dim), in f32.
        let inv_freq = (0..dim / 2).map(|i| 1.0f32 / base.powf((2 * i) as f32 / dim as f32)).collect();
        Rope { inv_freq, rotary_dim: dim }
    }

    /// `1 / theta^(2i / rotary_dim)` for each frequency, as computed here (the CUDA model
    /// uploads this table rather than recomputing it with the device's `powf`).
    pub fn inv_freq(&self) -> &[f32] {
        &self.inv_freq
    }

    pub fn rotary_dim(&self) -> usize {
        self.rotary_dim
    }

    /// `cos` and `sin` of every frequency at `pos`, rounded to the activation dtype (transformers
    /// casts them to the model dtype before use).
    pub fn cos_sin(&self, pos: usize, prec: Precision) -> (Vec<f32>, Vec<f32>) {
        let p = pos as f32;
        self.inv_freq
            .iter()
            .map(|f| {
                let a = p * f;
                (prec.round(a.cos()), prec.round(a.sin()))
            })
            .unzip()
    }

    /// Rotates one head vector in place with precomputed `cos_sin(pos)`.
    #[inline]
    pub fn apply(&self, head: &mut [f32], cos: &[f32], sin: &[f32], prec: Precision) {
        let half = self.rotary_dim / 2;
        for i in 0..half {
            let (x1, x2) = (head[i], head[i + half]);
            // q·cos + rotate_half(q)·sin, each product and the sum rounded like PyTorch.
            head[i] = prec.round(prec.round(x1 * cos[i]) + prec.round(-x2 * sin[i]));
            head[i + half] = prec.round(prec.round(x2 * cos[i]) + prec.round(x1 * sin[i]));
        }
    }
}
