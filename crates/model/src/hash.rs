//! A hash stable across builds and Rust versions (the std hasher is not): cache keys for
//! compiled kernels, and the fingerprints that tell two checkpoints or two outputs apart.

#![forbid(unsafe_code)]

/// FNV-1a, 64 bits: stable across builds and Rust versions (the std hasher is not).
pub fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for p in parts {
        for &b in *p {
            h ^= b as u64;
            h = h.wrapping_mul(0x100000001b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}
