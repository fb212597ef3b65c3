//! Weight matrices kept as the checkpoint stores them (f32, bf16 or f16), widened to f32 only
//! inside the kernels: a bf16 checkpoint costs 2 bytes a weight in memory and in every token's
//! pass over the weights, not 4.

use half::{bf16, f16};

/// A weight matrix's values in their stored dtype (row-major, like the checkpoint).
#[derive(Debug, Clone, PartialEq)]
pub enum Weights {
    F32(Vec<f32>),
    /// bf16 bit patterns.
    Bf16(Vec<u16>),
    /// IEEE half bit patterns.
    F16(Vec<u16>),
}

impl Weights {
    pub fn len(&self) -> usize {
        match self {
            Weights::F32(v) => v.len(),
            Weights::Bf16(v) | Weights::F16(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes per stored value.
    pub fn elem_bytes(&self) -> usize {
        match self {
            Weights::F32(_) => std::mem::size_of::<f32>(),
            Weights::Bf16(_) | Weights::F16(_) => std::mem::size_of::<u16>(),
        }
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.len() * self.elem_bytes()
    }

    pub fn dtype_name(&self) -> &'static str {
        match self {
            Weights::F32(_) => "f32",
            Weights::Bf16(_) => "bf16",
            Weights::F16(_) => "f16",
        }
    }

    /// Values `start..start + len`, in the same dtype.
    pub fn slice(&self, start: usize, len: usize) -> Weights {
        match self {
            Weights::F32(v) => Weights::F32(v[start..start + len].to_vec()),
            Weights::Bf16(v) => Weights::Bf16(v[start..start + len].to_vec()),
            Weights::F16(v) => Weights::F16(v[start..start + len].to_vec()),
        }
    }

    /// The parts one after the other. Parts of one dtype stay in it; mixed dtypes (which no
    /// checkpoint has within one layer) are widened to f32.
    pub fn concat(parts: Vec<Weights>) -> Weights {
        let same = parts.windows(2).all(|w| std::mem::discriminant(&w[0]) == std::mem::discriminant(&w[1]));
        if !same {
            return Weights::F32(parts.iter().flat_map(|p| p.to_f32()).collect());
        }
        let mut it = parts.into_iter();
        let Some(mut first) = it.next() else { return Weights::F32(vec![]) };
        for p in it {
            match (&mut first, p) {
                (Weights::F32(a), Weights::F32(b)) => a.extend(b),
                (Weights::Bf16(a), Weights::Bf16(b)) | (Weights::F16(a), Weights::F16(b)) => a.extend(b),
                _ => unreachable!("checked: one dtype"),
            }
        }
        first
    }

    /// Every value widened to f32 (exact: bf16 and f16 are subsets of f32).
    pub fn to_f32(&self) -> Vec<f32> {
        let mut out = Vec::with_capacity(self.len());
        self.widen_into(0, self.len(), &mut out);
        out
    }

    /// The values as f32, without a copy when they are f32 already.
    pub fn into_f32(self) -> Vec<f32> {
        match self {
            Weights::F32(v) => v,
            w => w.to_f32(),
        }
    }

    /// Values `start..start + len` widened to f32, appended to `out`.
    pub fn widen_into(&self, start: usize, len: usize, out: &mut Vec<f32>) {
        match self {
            Weights::F32(v) => out.extend_from_slice(&v[start..start + len]),
            Weights::Bf16(v) => out.extend(v[start..start + len].iter().map(|&b| bf16_to_f32(b))),
            Weights::F16(v) => out.extend(v[start..start + len].iter().map(|&b| f16::from_bits(b).to_f32())),
        }
    }

    /// The same values rounded to bf16 (the bf16 reference's cast of every parameter); bf16
    /// stays as it is.
    pub fn into_bf16(self) -> Weights {
        match self {
            Weights::F32(v) => Weights::Bf16(v.iter().map(|&x| bf16::from_f32(x).to_bits()).collect()),
            Weights::F16(v) => {
                Weights::Bf16(v.iter().map(|&b| bf16::from_f32(f16::from_bits(b).to_f32()).to_bits()).collect())
            }
            b @ Weights::Bf16(_) => b,
        }
    }
}

/// bf16 is the top half of an f32: widening is a shift.
#[inline(always)]
pub fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn widening_is_exact_and_sizes_come_from_the_dtype() {
        let xs = [1.5f32, -0.001_953_125, 3.0e38, 0.0];
        let b = Weights::F32(xs.to_vec()).into_bf16();
        assert_eq!(b.bytes(), 8);
        assert_eq!(b.to_f32(), xs.iter().map(|&x| bf16::from_f32(x).to_f32()).collect::<Vec<_>>());
        let h = Weights::F16(xs[..2].iter().map(|&x| f16::from_f32(x).to_bits()).collect());
        assert_eq!(h.to_f32(), vec![1.5, -0.001_953_125]);
        assert_eq!(Weights::F32(xs.to_vec()).bytes(), 16);
    }

    #[test]
    fn concat_keeps_one_dtype_and_widens_a_mix() {
        let a = Weights::Bf16(vec![0x3f80, 0x4000]);
        let b = Weights::Bf16(vec![0x4040]);
        assert_eq!(Weights::concat(vec![a.clone(), b]), Weights::Bf16(vec![0x3f80, 0x4000, 0x4040]));
        assert_eq!(Weights::concat(vec![a, Weights::F32(vec![4.0])]), Weights::F32(vec![1.0, 2.0, 4.0]));
        assert_eq!(Weights::Bf16(vec![1, 2, 3, 4]).slice(1, 2), Weights::Bf16(vec![2, 3]));
    }
}
