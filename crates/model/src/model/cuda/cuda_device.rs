//! A real GPU behind the [`Device`] seam: a context and a stream of its own on one device,
//! every kernel file compiled by NVRTC for its architecture (a CUBIN through the disk cache)
//! and loaded, raw driver calls for memory, copies and launches (all on the one stream, so each
//! kernel sees the writes of the ones before it).

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction, CudaStream, result as drv};
use cudarc::nvrtc::Ptx;

use super::device::{Arg, DevPtr, Device};
use super::error::{GpuError, GpuResult};
use super::kernels::KernelFile;
use super::nvrtc::{self, Target};
use super::probe::{self, GpuInfo};

pub(crate) struct CudaDevice {
    info: GpuInfo,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    functions: HashMap<&'static str, CudaFunction>,
}

impl CudaDevice {
    /// Opens GPU `ordinal`, compiling and loading `kernels` (NVRTC needed).
    pub(crate) fn open(ordinal: usize, kernels: &'static [KernelFile]) -> GpuResult<Self> {
        let report = probe::probe()?;
        let count = report.gpus.len();
        let info = report.gpus.into_iter().nth(ordinal).ok_or(GpuError::NoSuchGpu { ordinal, count })?;
        let ctx = CudaContext::new(ordinal)?;
        // A stream of its own: two devices opened on one GPU (a layer split tried on one card)
        // do not share one, and nothing waits on the legacy default stream.
        let stream = ctx.new_stream()?;
        let cache = nvrtc::default_cache_dir();
        let arch = info.arch();
        let mut functions = HashMap::new();
        for file in kernels {
            let compiled = nvrtc::compile(file, Target::Cubin, &arch, cache.as_deref())?;
            let module = ctx.load_module(Ptx::from_binary(compiled.code))?;
            for entry in file.entries {
                functions.insert(*entry, module.load_function(entry)?);
            }
        }
        Ok(CudaDevice { info, ctx, stream, functions })
    }

    fn bind(&self) -> GpuResult<()> {
        Ok(self.ctx.bind_to_thread()?)
    }
}

impl Device for CudaDevice {
    fn info(&self) -> &GpuInfo {
        &self.info
    }

    fn label(&self) -> String {
        format!("cuda:{}", self.info.ordinal)
    }

    fn emulated(&self) -> bool {
        false
    }

    fn alloc(&self, bytes: usize) -> GpuResult<DevPtr> {
        self.bind()?;
        let stream = self.stream.cu_stream();
        // SAFETY: the stream is live; the memory is zeroed on the same stream before any use.
        unsafe {
            let p = drv::malloc_async(stream, bytes.max(1))?;
            drv::memset_d8_async(p, 0, bytes.max(1), stream)?;
            Ok(p)
        }
    }

    unsafe fn free(&self, ptr: DevPtr, _bytes: usize) {
        if self.bind().is_ok() {
            // SAFETY: allocated on this stream; launches that use it are ordered before.
            let _ = unsafe { drv::free_async(ptr, self.stream.cu_stream()) };
        }
    }

    unsafe fn htod(&self, src: &[u8], dst: DevPtr) -> GpuResult<()> {
        self.bind()?;
        // SAFETY: the caller guarantees the range; the copy completes before `src` is released
        // (the synchronisation below).
        unsafe { drv::memcpy_htod_async(dst, src, self.stream.cu_stream()) }?;
        self.synchronize()
    }

    unsafe fn dtoh(&self, src: DevPtr, dst: &mut [u8]) -> GpuResult<()> {
        self.bind()?;
        // SAFETY: the caller guarantees the range; synchronised before `dst` is read.
        unsafe { drv::memcpy_dtoh_async(dst, src, self.stream.cu_stream()) }?;
        self.synchronize()
    }

    unsafe fn dtod(&self, src: DevPtr, dst: DevPtr, bytes: usize) -> GpuResult<()> {
        self.bind()?;
        // SAFETY: the caller guarantees both ranges; stream-ordered like the launches.
        unsafe { drv::memcpy_dtod_async(dst, src, bytes, self.stream.cu_stream()) }?;
        Ok(())
    }

    unsafe fn launch(&self, kernel: &str, grid: (u32, u32, u32), block: u32, args: &[Arg]) -> GpuResult<()> {
        self.bind()?;
        let f = self.functions.get(kernel).ok_or_else(|| GpuError::NoKernel(kernel.into()))?;
        // cuLaunchKernel reads each parameter through a pointer to its value.
        let mut slots: Vec<u64> = args.iter().map(Arg::slot).collect();
        let mut params: Vec<*mut c_void> = slots.iter_mut().map(|s| s as *mut u64 as *mut c_void).collect();
        // SAFETY: the caller guarantees the arguments match the kernel; `slots` outlives the
        // call, which copies the parameters before it returns.
        unsafe {
            drv::launch_kernel(f.cu_function(), grid, (block, 1, 1), 0, self.stream.cu_stream(), &mut params)
                .map_err(|e| GpuError::Launch { kernel: kernel.into(), message: format!("{:?}", e.0) })
        }
    }

    fn synchronize(&self) -> GpuResult<()> {
        self.bind()?;
        Ok(self.stream.synchronize()?)
    }

    fn memory(&self) -> GpuResult<(u64, u64)> {
        self.bind()?;
        let (free, total) = self.ctx.mem_get_info()?;
        Ok((free as u64, total as u64))
    }
}
