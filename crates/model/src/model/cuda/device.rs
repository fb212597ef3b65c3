//! The device seam under the CUDA model: what the model's host code needs from a device —
//! allocate, copy, launch a kernel by name, synchronise, report memory. Two implementations:
//! a real GPU through the driver ([`super::cuda_device::CudaDevice`]) and the emulated device
//! ([`super::emu::EmuDevice`]: `kernels/*.cu` compiled for the CPU, each CUDA thread a fiber).
//! `ops.rs` and `model.rs` are written once against this trait, so the emulator runs the very
//! launches, grids, blocks and argument lists a GPU gets.
//!
//! Device memory is addressed by a plain `u64` (a `CUdeviceptr` on a GPU, a host address on the
//! emulator); [`Buf`] owns an allocation and frees it on drop.

use std::marker::PhantomData;
use std::sync::Arc;

use super::error::GpuResult;
use super::probe::GpuInfo;

/// A device address.
pub type DevPtr = u64;

/// One kernel argument, as `cuLaunchKernel` takes it (the value, by its C type).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Arg {
    /// A device pointer (0: null).
    Ptr(DevPtr),
    /// `int`.
    I32(i32),
    /// `unsigned int`.
    U32(u32),
    /// `long long`.
    I64(i64),
    /// `float`.
    F32(f32),
}

impl Arg {
    /// The null pointer argument.
    pub const NULL: Arg = Arg::Ptr(0);

    /// The letter the emulator's kernel signatures use for this C type.
    pub fn code(&self) -> char {
        match self {
            Arg::Ptr(_) => 'p',
            Arg::I32(_) => 'i',
            Arg::U32(_) => 'u',
            Arg::I64(_) => 'l',
            Arg::F32(_) => 'f',
        }
    }

    /// The argument's bytes, in a slot of 8 (what the launch's parameter array points at).
    pub fn slot(&self) -> u64 {
        match *self {
            Arg::Ptr(p) => p,
            Arg::I32(v) => v as u32 as u64,
            Arg::U32(v) => v as u64,
            Arg::I64(v) => v as u64,
            Arg::F32(v) => v.to_bits() as u64,
        }
    }
}

/// What runs kernels: a GPU, or the emulated device.
pub trait Device: Send + Sync {
    fn info(&self) -> &GpuInfo;
    /// "cuda:0", "emu:1".
    fn label(&self) -> String;
    /// Whether this is the emulated device (the status bar and reports say so).
    fn emulated(&self) -> bool;
    /// `bytes` of zeroed device memory (at least one byte is allocated).
    fn alloc(&self, bytes: usize) -> GpuResult<DevPtr>;
    /// # Safety
    /// `ptr` came from [`Device::alloc`] on this device with `bytes`, and no launch in flight
    /// uses it.
    unsafe fn free(&self, ptr: DevPtr, bytes: usize);
    /// # Safety
    /// `dst .. dst + src.len()` lies inside one live allocation of this device.
    unsafe fn htod(&self, src: &[u8], dst: DevPtr) -> GpuResult<()>;
    /// # Safety
    /// `src .. src + dst.len()` lies inside one live allocation of this device.
    unsafe fn dtoh(&self, src: DevPtr, dst: &mut [u8]) -> GpuResult<()>;
    /// # Safety
    /// Both ranges lie inside live allocations of this device.
    unsafe fn dtod(&self, src: DevPtr, dst: DevPtr, bytes: usize) -> GpuResult<()>;
    /// Launches `kernel` on a 1-D block of `block` threads over `grid`, in order after every
    /// earlier launch and copy on this device.
    ///
    /// # Safety
    /// `args` are the kernel's parameters in order and type, and every buffer they point at is
    /// as large as the kernel reads and writes for this grid.
    unsafe fn launch(&self, kernel: &str, grid: (u32, u32, u32), block: u32, args: &[Arg]) -> GpuResult<()>;
    fn synchronize(&self) -> GpuResult<()>;
    /// (free, total) bytes now.
    fn memory(&self) -> GpuResult<(u64, u64)>;
    /// The most bytes allocated at once since the device opened or the last reset, where the
    /// device keeps count (the emulated device does; checks the memory plan).
    fn peak_bytes(&self) -> Option<u64> {
        None
    }
    fn reset_peak(&self) {}
}

/// An element type of device buffers (plain old data of the kernels' C types).
pub trait Elem: Copy + Default + Send + Sync + 'static {}
impl Elem for u8 {}
impl Elem for u16 {}
impl Elem for f32 {}
impl Elem for i32 {}
impl Elem for u32 {}

fn as_bytes<T: Elem>(x: &[T]) -> &[u8] {
    // SAFETY: Elem types are plain old data without padding.
    unsafe { std::slice::from_raw_parts(x.as_ptr() as *const u8, std::mem::size_of_val(x)) }
}

fn as_bytes_mut<T: Elem>(x: &mut [T]) -> &mut [u8] {
    // SAFETY: Elem types are plain old data: every byte pattern is a value.
    unsafe { std::slice::from_raw_parts_mut(x.as_mut_ptr() as *mut u8, std::mem::size_of_val(x)) }
}

/// `len` elements of `T` on one device, freed on drop. bf16 is `Buf<u16>` (raw bits, as in
/// the kernels).
pub struct Buf<T: Elem> {
    dev: Arc<dyn Device>,
    ptr: DevPtr,
    len: usize,
    _t: PhantomData<T>,
}

impl<T: Elem> Buf<T> {
    /// Zeroed.
    pub fn zeros(dev: &Arc<dyn Device>, len: usize) -> GpuResult<Self> {
        let ptr = dev.alloc(len.max(1) * std::mem::size_of::<T>())?;
        Ok(Buf { dev: dev.clone(), ptr, len, _t: PhantomData })
    }

    pub fn from_host(dev: &Arc<dyn Device>, x: &[T]) -> GpuResult<Self> {
        let b = Self::zeros(dev, x.len())?;
        // SAFETY: the allocation holds x.len() elements.
        unsafe { dev.htod(as_bytes(x), b.ptr) }?;
        Ok(b)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn bytes(&self) -> usize {
        self.len * std::mem::size_of::<T>()
    }

    /// The buffer as a kernel argument.
    pub fn arg(&self) -> Arg {
        Arg::Ptr(self.ptr)
    }

    /// A pointer `offset` elements in (a view the kernel reads from there on).
    pub fn at(&self, offset: usize) -> Arg {
        debug_assert!(offset <= self.len);
        Arg::Ptr(self.ptr + (offset * std::mem::size_of::<T>()) as u64)
    }

    pub fn read(&self) -> GpuResult<Vec<T>> {
        self.read_range(0..self.len)
    }

    pub fn read_range(&self, r: std::ops::Range<usize>) -> GpuResult<Vec<T>> {
        assert!(r.start <= r.end && r.end <= self.len, "read {r:?} of a buffer of {}", self.len);
        let mut out = vec![T::default(); r.len()];
        // SAFETY: the range lies inside this allocation (checked above).
        unsafe { self.dev.dtoh(self.ptr + (r.start * std::mem::size_of::<T>()) as u64, as_bytes_mut(&mut out)) }?;
        Ok(out)
    }

    /// A new buffer holding elements `r` of this one (on the same device).
    pub fn copy_range(&self, r: std::ops::Range<usize>) -> GpuResult<Self> {
        assert!(r.start <= r.end && r.end <= self.len, "copy {r:?} of a buffer of {}", self.len);
        let out = Self::zeros(&self.dev, r.len())?;
        let size = std::mem::size_of::<T>();
        // SAFETY: both ranges lie inside their allocations (checked above).
        unsafe { self.dev.dtod(self.ptr + (r.start * size) as u64, out.ptr, r.len() * size) }?;
        Ok(out)
    }

    /// Overwrites the buffer from the host (`x.len()` must be its length).
    pub fn write(&mut self, x: &[T]) -> GpuResult<()> {
        assert_eq!(x.len(), self.len, "write of {} elements into a buffer of {}", x.len(), self.len);
        // SAFETY: the allocation holds len elements.
        unsafe { self.dev.htod(as_bytes(x), self.ptr) }
    }

    pub fn device(&self) -> &Arc<dyn Device> {
        &self.dev
    }
}

impl<T: Elem> Drop for Buf<T> {
    fn drop(&mut self) {
        // SAFETY: allocated by this device with this size; launches are stream-ordered before
        // the free on a GPU and complete on return on the emulator.
        unsafe { self.dev.free(self.ptr, self.len.max(1) * std::mem::size_of::<T>()) }
    }
}

impl<T: Elem> std::fmt::Debug for Buf<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Buf<{}>[{}] on {}", std::any::type_name::<T>(), self.len, self.dev.label())
    }
}
