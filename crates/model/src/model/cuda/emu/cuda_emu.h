// deltascope's emulated CUDA device: the CUDA C++ that kernels/*.cu use, as plain C++ for the
// CPU. Put in front of the prelude and one kernel file by src/model/cuda/emu.rs; the fiber
// runtime (cuda_emu_rt.cpp) goes after them, with one launch trampoline per entry point.
//
// Each CUDA thread of a block is a fiber; a block's fibers run on the launching OS thread and
// yield only at __syncthreads and warp shuffles, which are rendezvous points: a barrier waits
// for every thread of the block, a shuffle for every lane of the warp. Blocks run one after
// another. Shared memory is `static` storage in one section, filled with 0xFF bytes (NaN as
// f32) before every block, so a read before the block wrote it shows.
//
// Stricter than a GPU where a GPU is merely undefined: a full-mask shuffle in a partial warp,
// lanes of a warp at different shuffles, and a thread that exits while the others wait at a
// __syncthreads are errors, reported with counts; the launch stops there.

#include <math.h>
#include <stdint.h>
#include <string.h>

#undef INFINITY  // the prelude defines its own, as NVRTC sees no <math.h>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __shared__ static __attribute__((section("emu_shared"), aligned(16)))

struct emu_dim3 {
    unsigned int x, y, z;
};

struct uint4 {
    unsigned int x, y, z, w;
} __attribute__((aligned(16)));

struct uint2 {
    unsigned int x, y;
} __attribute__((aligned(8)));

namespace emu {
struct Fiber;
extern Fiber* current;
extern emu_dim3 block_idx, block_dim, grid_dim;
const emu_dim3& thread_idx();
void syncthreads();
uint64_t shfl_xor(unsigned int mask, uint64_t bits, int lane_mask);
}  // namespace emu

#define threadIdx (emu::thread_idx())
#define blockIdx (emu::block_idx)
#define blockDim (emu::block_dim)
#define gridDim (emu::grid_dim)

static inline void __syncthreads() { emu::syncthreads(); }

template <typename T>
static inline T __shfl_xor_sync(unsigned int mask, T v, int lane_mask) {
    static_assert(sizeof(T) <= 8, "shuffles move at most 8 bytes");
    uint64_t bits = 0;
    memcpy(&bits, &v, sizeof(T));
    bits = emu::shfl_xor(mask, bits, lane_mask);
    T out;
    memcpy(&out, &bits, sizeof(T));
    return out;
}

static inline float __int_as_float(int i) {
    float f;
    memcpy(&f, &i, 4);
    return f;
}
static inline float __uint_as_float(unsigned int u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline unsigned int __float_as_uint(float f) {
    unsigned int u;
    memcpy(&u, &f, 4);
    return u;
}
static inline int __float_as_int(float f) {
    int i;
    memcpy(&i, &f, 4);
    return i;
}
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }

// One OS thread runs a block's fibers, and a fiber is never pre-empted: a plain add is atomic.
template <typename T>
static inline T atomicAdd(T* p, T v) {
    T old = *p;
    *p = old + v;
    return old;
}

// Launch trampolines: cuLaunchKernel's `void**` argument array unpacked into the kernel's own
// parameters, and the kernel's signature as one letter per parameter (p pointer, i int, u
// unsigned, l long long, f float) so the host checks every launch's argument list.
#include <type_traits>
#include <utility>

namespace emu {
template <typename T>
constexpr char type_code() {
    return std::is_pointer<T>::value ? 'p'
           : std::is_floating_point<T>::value ? (sizeof(T) == 4 ? 'f' : 'd')
           : std::is_unsigned<T>::value ? (sizeof(T) == 4 ? 'u' : 'U')
                                        : (sizeof(T) == 4 ? 'i' : 'l');
}
template <typename... A, size_t... I>
inline void invoke_with(void (*f)(A...), void** args, std::index_sequence<I...>) {
    f(*static_cast<typename std::remove_reference<A>::type*>(args[I])...);
}
template <typename... A>
inline void invoke(void (*f)(A...), void** args) {
    invoke_with(f, args, std::index_sequence_for<A...>{});
}
template <typename... A>
inline const char* signature(void (*)(A...)) {
    static const char s[] = {type_code<A>()..., 0};
    return s;
}
}  // namespace emu
