//! A run of plain values (f32, bf16 bits, FP8 codes): owned, or a view into a mapped (or
//! embedded) checkpoint file. The leaf under the stored weights (storage.rs) and the FP8 weights
//! (fp8.rs).

use std::ops::Deref;
use std::sync::Arc;

use crate::checkpoint::FileBytes;

/// The plain value types a mapped view may hold: every bit pattern is a valid value, and the
/// file stores them little-endian.
pub trait Plain: Copy + Send + Sync + 'static + private::Sealed {}
impl Plain for f32 {}
impl Plain for u16 {}
impl Plain for u8 {}
mod private {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for u16 {}
    impl Sealed for u8 {}
}

/// A run of values: owned, or `len` values at byte `offset` of a mapped (or embedded) file.
pub enum Values<T: Plain> {
    Owned(Vec<T>),
    Mapped { file: Arc<FileBytes>, offset: usize, len: usize },
}

impl<T: Plain> Values<T> {
    /// A view of `len` values at byte `offset` of `file`, when the bytes are there, aligned
    /// for `T`, and in this CPU's byte order; `None` otherwise (the caller copies instead).
    pub fn view(file: &Arc<FileBytes>, offset: usize, len: usize) -> Option<Self> {
        let size = std::mem::size_of::<T>();
        let end = offset.checked_add(len.checked_mul(size)?)?;
        let ptr = file.get(offset..end)?.as_ptr();
        (cfg!(target_endian = "little") && (ptr as usize).is_multiple_of(std::mem::align_of::<T>()))
            .then(|| Values::Mapped { file: Arc::clone(file), offset, len })
    }

    pub fn is_mapped(&self) -> bool {
        matches!(self, Values::Mapped { .. })
    }

    /// Values `start..start + len`: a narrower view of a mapped run (no copy), or a copy.
    pub fn range(&self, start: usize, len: usize) -> Self {
        match self {
            Values::Owned(v) => Values::Owned(v[start..start + len].to_vec()),
            Values::Mapped { file, offset, len: have } => {
                assert!(start + len <= *have, "range {start}+{len} of {have} values");
                Values::Mapped { file: Arc::clone(file), offset: offset + start * std::mem::size_of::<T>(), len }
            }
        }
    }

    pub fn into_vec(self) -> Vec<T> {
        match self {
            Values::Owned(v) => v,
            mapped => mapped.to_vec(),
        }
    }
}

impl<T: Plain> Deref for Values<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        match self {
            Values::Owned(v) => v,
            Values::Mapped { file, offset, len } => {
                let bytes = &file[*offset..*offset + *len * std::mem::size_of::<T>()];
                // SAFETY: `view` checked that these bytes are inside the file, aligned for
                // `T`, and little-endian like this CPU; `T` is f32, u16 or u8, for which every bit
                // pattern is a value. The mapping is read-only and lives as long as the `Arc`.
                unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<T>(), *len) }
            }
        }
    }
}

impl<T: Plain> From<Vec<T>> for Values<T> {
    fn from(v: Vec<T>) -> Self {
        Values::Owned(v)
    }
}

impl<T: Plain + PartialEq> PartialEq for Values<T> {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl<T: Plain + std::fmt::Debug> std::fmt::Debug for Values<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let how = if self.is_mapped() { "mapped" } else { "owned" };
        write!(f, "{how} {} values", self.len())
    }
}
