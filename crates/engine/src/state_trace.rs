//! A pass's state trace (model::StateTrace) as the protocol's `state` event.

use deltascope_model::{LayerTrace, StateTrace};
use deltascope_protocol::{AttentionLayerState, GdnLayerState, StateEvent};

/// The `state` event of one traced pass.
pub(crate) fn state_event(trace: &StateTrace, at_token: Option<usize>, position: usize) -> StateEvent {
    let mut gdn = vec![];
    let mut attention = vec![];
    let mut tokens = 0;
    for (layer, t) in trace.layers.iter().enumerate() {
        match t {
            LayerTrace::Gdn(p) => {
                tokens = p.tokens;
                let (hv, n) = (p.heads, p.tokens.max(1));
                let mean = |f: &dyn Fn(f32) -> f64, xs: &[f32], h: usize| -> f32 {
                    ((0..p.tokens).map(|t| f(xs[t * hv + h])).sum::<f64>() / n as f64) as f32
                };
                let id = |x: f32| x as f64;
                let exp = |x: f32| (x as f64).exp();
                gdn.push(GdnLayerState {
                    layer,
                    beta: (0..hv).map(|h| mean(&id, &p.beta, h)).collect(),
                    g: (0..hv).map(|h| mean(&id, &p.g, h)).collect(),
                    retention: (0..hv).map(|h| mean(&exp, &p.g, h)).collect(),
                    state_norm: p.state_norm.clone(),
                    delta_ratio: p
                        .delta_norm
                        .iter()
                        .zip(&p.state_norm)
                        .map(|(&d, &s)| {
                            if s > 0.0 {
                                d / s
                            } else if d > 0.0 {
                                f32::INFINITY
                            } else {
                                0.0
                            }
                        })
                        .collect(),
                    nonfinite: p.nonfinite.clone(),
                    g_slack: (0..hv).map(|h| (step(p, &p.a, h) as f64).exp_m1() as f32).collect(),
                    beta_slack: (0..hv).map(|h| step(p, &p.b, h) / 4.0 + step(p, &p.beta, h)).collect(),
                });
            }
            LayerTrace::Attention { kv_len, kv_bytes } => {
                attention.push(AttentionLayerState { layer, kv_len: *kv_len, kv_bytes: *kv_bytes })
            }
        }
    }
    StateEvent { at_token, tokens, position, gdn, attention }
}

/// One rounding step (the distance to the next representable value away from zero) of the
/// largest |x| head `h` of `xs` ([T][Hv]) held over the pass, in the precision the layer rounded
/// its gates to: bf16 (8 significant bits) or f32 (24).
fn step(p: &deltascope_model::GdnPassTrace, xs: &[f32], h: usize) -> f32 {
    let largest = (0..p.tokens).map(|t| xs[t * p.heads + h].abs()).filter(|x| x.is_finite()).fold(0f32, f32::max);
    let bits = if p.gates_bf16 { 8 } else { 24 };
    if largest == 0.0 {
        return 0.0;
    }
    // 2^(floor(log2 x) − bits + 1), from the f32 exponent (normal values; a subnormal's step is
    // below anything a comparison cares about).
    let exponent = ((largest.to_bits() >> 23) & 0xff) as i32 - 127;
    2f32.powi(exponent - bits + 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltascope_model::GdnPassTrace;

    #[test]
    fn a_pass_becomes_means_per_head() {
        let trace = StateTrace {
            layers: vec![
                LayerTrace::Gdn(GdnPassTrace {
                    tokens: 2,
                    heads: 2,
                    beta: vec![0.2, 0.4, 0.6, 0.8],
                    g: vec![-1.0, 0.0, -3.0, 0.0],
                    a: vec![-7.0, 0.5, 6.5, 0.25],
                    b: vec![1.0, -3.0, 0.0, 2.0],
                    gates_bf16: true,
                    state_norm: vec![2.0, 0.0],
                    delta_norm: vec![1.0, 0.0],
                    nonfinite: vec![0, 0],
                }),
                LayerTrace::Attention { kv_len: 7, kv_bytes: 64 },
            ],
        };
        let e = state_event(&trace, Some(3), 9);
        assert_eq!((e.tokens, e.at_token, e.position), (2, Some(3), 9));
        let l = &e.gdn[0];
        assert!((l.beta[0] - 0.4).abs() < 1e-6 && (l.beta[1] - 0.6).abs() < 1e-6);
        assert_eq!(l.g, vec![-2.0, 0.0]);
        assert!((l.retention[0] - ((-1f32).exp() + (-3f32).exp()) / 2.0).abs() < 1e-6);
        assert_eq!(l.delta_ratio, vec![0.5, 0.0]);
        // Head 0's largest |a| is 7 (a bf16 step of 2⁻⁵), head 1's 0.5 (2⁻⁸); its largest |b| 1
        // (2⁻⁷) and 3 (2⁻⁶), its largest β 0.6 (2⁻⁸) and 0.8 (2⁻⁸).
        let close = |x: f32, y: f64| ((x as f64) - y).abs() <= 1e-7 * y;
        assert!(close(l.g_slack[0], (2f64.powi(-5)).exp_m1()) && close(l.g_slack[1], (2f64.powi(-8)).exp_m1()));
        assert!(close(l.beta_slack[0], 2f64.powi(-9) + 2f64.powi(-8)), "{:?}", l.beta_slack);
        assert!(close(l.beta_slack[1], 2f64.powi(-8) + 2f64.powi(-8)), "{:?}", l.beta_slack);
        assert_eq!(l.half_life(1), f32::INFINITY);
        assert!((deltascope_protocol::half_life(-std::f32::consts::LN_2) - 1.0).abs() < 1e-6);
        assert_eq!(e.attention[0], AttentionLayerState { layer: 1, kv_len: 7, kv_bytes: 64 });
        assert_eq!(e.alarm(1e6), None);
        let mut bad = e.clone();
        bad.gdn[0].state_norm[1] = f32::NAN;
        assert_eq!(bad.alarm(1e6).map(|a| (a.0, a.1)), Some((0, 1)));
    }
}
