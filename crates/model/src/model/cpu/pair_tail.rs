//! The scalar tail of the decode GEMV's pair order (`gemv::PairKernel`) past the last full
//! block: shared by the GEMV and the AMX kernel, which keeps the same order, so that neither
//! imports the other for it.

use crate::model::storage::bf16_to_f32;

/// The scalar tail past the last full block, in order.
#[inline(always)]
pub(super) fn pairs_tail(w: &[u16], x: &[u16], from: usize) -> f32 {
    let mut s = 0f32;
    for i in from..w.len().min(x.len()) {
        s += bf16_to_f32(w[i]) * bf16_to_f32(x[i]);
    }
    s
}
