//! The CUDA kernels' sources (`kernels/*.cu`, compiled into the binary) and the entry points
//! each must define. Every file is compiled on its own with `kernels/prelude.cu` in front.

/// One kernel file.
#[derive(Debug, Clone, Copy)]
pub struct KernelFile {
    pub name: &'static str,
    pub source: &'static str,
    /// The `extern "C" __global__` functions it defines.
    pub entries: &'static [&'static str],
}

pub const PRELUDE: &str = include_str!("../../../kernels/prelude.cu");

macro_rules! kernel_file {
    ($name:literal, [$($entry:literal),* $(,)?]) => {
        KernelFile {
            name: $name,
            source: include_str!(concat!("../../../kernels/", $name, ".cu")),
            entries: &[$($entry),*],
        }
    };
}

pub const FILES: &[KernelFile] = &[
    kernel_file!("embedding", ["embed_gather"]),
    kernel_file!("norm", ["rms_norm", "rms_norm_gated"]),
    kernel_file!("rope", ["rope_mrope"]),
    kernel_file!("gemv", ["gemv_bf16"]),
    kernel_file!("gemm", ["gemm_bf16_tiled"]),
    kernel_file!("conv1d", ["conv1d_decode", "conv1d_restore_slot", "conv1d_prefill", "conv1d_save_state"]),
    kernel_file!("gdn", ["gdn_recurrent", "gdn_restore_slot"]),
    kernel_file!("attention", ["attn_gqa", "kv_append"]),
    kernel_file!("elementwise", ["add_bf16", "swiglu", "f32_to_bf16", "concat_rows", "count_nonfinite_f32"]),
    kernel_file!("moe", ["moe_topk", "moe_gemv", "moe_combine", "sigmoid_scale_rows"]),
];

impl KernelFile {
    /// What NVRTC compiles: the prelude, then the file (a `#line` keeps error lines the file's).
    pub fn full_source(&self) -> String {
        format!("{PRELUDE}\n#line 1 \"{}.cu\"\n{}", self.name, self.source)
    }
}

pub fn file(name: &str) -> Option<&'static KernelFile> {
    FILES.iter().find(|f| f.name == name)
}
