//! MTP speculative decoding: what depth to draft at and whether to accept a draft
//! ([`control`]: the settings, live metrics, adaptive depth and rejection sampling), and the
//! speculative step of the local loop ([`step`]: draft, verify in one pass, keep the prefix).

pub(crate) mod control;
pub(crate) mod step;
