// The fiber runtime of the emulated CUDA device (see cuda_emu.h). Appended to each kernel file's
// translation unit, after the launch trampolines; every symbol but the exported C entry points
// is hidden, so the per-file libraries never bind to each other's copies.

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

#if defined(__SANITIZE_ADDRESS__)
#include <pthread.h>
extern "C" void __sanitizer_start_switch_fiber(void** fake_stack_save, const void* bottom, size_t size);
extern "C" void __sanitizer_finish_switch_fiber(void* fake_stack_save, const void** bottom_old, size_t* size_old);
#define EMU_STACK_BYTES (1u << 20)
#else
#define EMU_STACK_BYTES (64u << 10)
#endif

#define EMU_EXPORT extern "C" __attribute__((visibility("default")))

extern "C" char __start_emu_shared[] __attribute__((weak));
extern "C" char __stop_emu_shared[] __attribute__((weak));

namespace emu {

enum State { READY, AT_BARRIER, AT_SHUFFLE, EXITED };

struct Fiber {
    void* sp;
    char* stack;
    emu_dim3 tid;
    int linear;
    int state;
    uint64_t shfl_in, shfl_out;
    int shfl_lane_mask;
    const void* shfl_site;
    unsigned shfl_seq;
    void* fake_stack;
#if !defined(__x86_64__)
    ucontext_t ctx;
#endif
};

Fiber* current;
emu_dim3 block_idx, block_dim, grid_dim;

static Fiber* fibers;
static int pool_size;
static int nthreads;
static int at_barrier, at_shuffle, exited;
static int warp_arrived[32];
static void (*entry)(void**);
static void** entry_args;
static bool failed;
static char error_text[1024];

static void* sched_sp;
// The pass over the block's fibers in schedule order: a fiber that stops at a rendezvous hands
// the CPU straight to the next runnable fiber of the pass, and to the scheduler when the pass
// is over (one switch per hand-over, not two).
static int* order;
static int pass_pos;

static Fiber* next_in_pass() {
    while (++pass_pos < nthreads) {
        Fiber* f = fibers + order[pass_pos];
        if (f->state == READY) return f;
    }
    return nullptr;
}
#if !defined(__x86_64__)
static ucontext_t sched_ctx;
#endif
static const void* sched_stack_bottom;
static size_t sched_stack_size;

const emu_dim3& thread_idx() { return current->tid; }

static void fail(const char* fmt, ...) {
    if (failed) return;
    failed = true;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(error_text, sizeof error_text, fmt, ap);
    va_end(ap);
}

static void fail_deadlock(const char* what) {
    fail("%s in block (%u,%u,%u): %d threads at __syncthreads, %d at a shuffle, %d exited, of %d", what,
         block_idx.x, block_idx.y, block_idx.z, at_barrier, at_shuffle, exited, nthreads);
}

#if defined(__x86_64__)
// Saves the callee-saved registers and the stack pointer in *save, loads `load`'s. The kernels
// never change the floating-point environment, so MXCSR and the x87 control word stay shared.
extern "C" void emu_switch_context(void** save, void* load) __attribute__((visibility("hidden")));
asm(R"(
    .text
    .p2align 4
    .type emu_switch_context,@function
emu_switch_context:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size emu_switch_context, .-emu_switch_context
)");
#endif

static void to_scheduler(bool final_exit) {
    Fiber* f = current;
    Fiber* next = failed ? nullptr : next_in_pass();
#if defined(__SANITIZE_ADDRESS__)
    if (next)
        __sanitizer_start_switch_fiber(final_exit ? nullptr : &f->fake_stack, next->stack, EMU_STACK_BYTES);
    else
        __sanitizer_start_switch_fiber(final_exit ? nullptr : &f->fake_stack, sched_stack_bottom, sched_stack_size);
#else
    (void)final_exit;
#endif
    if (next) current = next;
#if defined(__x86_64__)
    emu_switch_context(&f->sp, next ? next->sp : sched_sp);
#else
    swapcontext(&f->ctx, next ? &next->ctx : &sched_ctx);
#endif
#if defined(__SANITIZE_ADDRESS__)
    __sanitizer_finish_switch_fiber(f->fake_stack, nullptr, nullptr);
#endif
}

static void fiber_main() {
#if defined(__SANITIZE_ADDRESS__)
    __sanitizer_finish_switch_fiber(nullptr, nullptr, nullptr);
#endif
    entry(entry_args);
    current->state = EXITED;
    ++exited;
    if (at_barrier > 0) fail_deadlock("a thread exited while others wait at __syncthreads: deadlock");
    to_scheduler(true);
    __builtin_trap();
}

static void run(Fiber* f) {
    current = f;
#if defined(__SANITIZE_ADDRESS__)
    void* fake = nullptr;
    __sanitizer_start_switch_fiber(&fake, f->stack, EMU_STACK_BYTES);
#endif
#if defined(__x86_64__)
    emu_switch_context(&sched_sp, f->sp);
#else
    swapcontext(&sched_ctx, &f->ctx);
#endif
#if defined(__SANITIZE_ADDRESS__)
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
}

static bool ensure_pool(int n) {
    if (pool_size >= n) return true;
    Fiber* grown = (Fiber*)realloc(fibers, sizeof(Fiber) * n);
    if (!grown) return false;
    fibers = grown;
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    for (int i = pool_size; i < n; ++i) {
        void* m = mmap(nullptr, EMU_STACK_BYTES + page, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m == MAP_FAILED) return false;
        mprotect(m, page, PROT_NONE);  // a guard page under the stack
        fibers[i].stack = (char*)m + page;
        pool_size = i + 1;
    }
    return true;
}

static void start_fiber(Fiber* f) {
    f->state = READY;
    f->shfl_seq = 0;
    f->fake_stack = nullptr;
#if defined(__x86_64__)
    // The frame emu_switch_context pops: r15..rbp, then fiber_main as the return address;
    // fiber_main starts with rsp ≡ 8 (mod 16), as after a call.
    // Each fiber's stack top is shifted by its own multiple of a cache line (mod 4 KiB): stacks
    // a page-multiple apart would otherwise all map their hot frames to the same L1 set.
    uintptr_t top = ((uintptr_t)(f->stack + EMU_STACK_BYTES - 64 * (f->linear & 63))) & ~(uintptr_t)15;
    uint64_t* sp = (uint64_t*)top;
    *--sp = 0;                          // fiber_main's return address (never used)
    *--sp = (uint64_t)(void*)&fiber_main;
    for (int i = 0; i < 6; ++i) *--sp = 0;
    f->sp = sp;
#else
    getcontext(&f->ctx);
    f->ctx.uc_stack.ss_sp = f->stack;
    f->ctx.uc_stack.ss_size = EMU_STACK_BYTES;
    f->ctx.uc_link = nullptr;
    makecontext(&f->ctx, (void (*)())fiber_main, 0);
#endif
}

void syncthreads() {
    Fiber* f = current;
    if (exited > 0) {
        fail_deadlock("__syncthreads after a thread of the block exited: deadlock");
        to_scheduler(false);
    }
    f->state = AT_BARRIER;
    if (++at_barrier == nthreads) {
        for (int i = 0; i < nthreads; ++i) fibers[i].state = READY;
        at_barrier = 0;
    }
    to_scheduler(false);
}

__attribute__((noinline)) uint64_t shfl_xor(unsigned int mask, uint64_t bits, int lane_mask) {
    Fiber* f = current;
    const int warp = f->linear >> 5;
    if (mask != 0xffffffffu) {
        fail("__shfl_xor_sync with mask %#x: only full-mask shuffles are emulated", mask);
        to_scheduler(false);
    }
    if (nthreads - warp * 32 < 32) {
        fail("__shfl_xor_sync(0xffffffff) in a partial warp (blockDim %d, not a multiple of 32): undefined on a GPU",
             nthreads);
        to_scheduler(false);
    }
    if (lane_mask < 0 || lane_mask > 31) {
        fail("__shfl_xor_sync lane mask %d: must be 0..31 in a warp of 32", lane_mask);
        to_scheduler(false);
    }
    f->shfl_in = bits;
    f->shfl_lane_mask = lane_mask;
    f->shfl_site = __builtin_return_address(0);
    f->state = AT_SHUFFLE;
    ++at_shuffle;
    if (++warp_arrived[warp & 31] == 32) {
        Fiber* lanes = fibers + warp * 32;
        for (int i = 1; i < 32; ++i) {
            if (lanes[i].shfl_seq != lanes[0].shfl_seq || lanes[i].shfl_site != lanes[0].shfl_site ||
                lanes[i].shfl_lane_mask != lanes[0].shfl_lane_mask) {
                fail("divergent __shfl_xor_sync in block (%u,%u,%u), warp %d: lane 0 at shuffle #%u, lane %d at #%u "
                     "(another call site or lane mask)",
                     block_idx.x, block_idx.y, block_idx.z, warp, lanes[0].shfl_seq, i, lanes[i].shfl_seq);
                to_scheduler(false);
            }
        }
        for (int i = 0; i < 32; ++i) {
            lanes[i].shfl_out = lanes[i ^ lane_mask].shfl_in;
            lanes[i].state = READY;
            ++lanes[i].shfl_seq;
        }
        warp_arrived[warp & 31] = 0;
        at_shuffle -= 32;
    }
    to_scheduler(false);
    return f->shfl_out;
}

static uint64_t rng_state;
static uint64_t next_random() {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

// 0 forward, 1 reverse, 2 seeded random.
static int run_block(int schedule, uint64_t seed) {
    if (__start_emu_shared != __stop_emu_shared) memset(__start_emu_shared, 0xff, __stop_emu_shared - __start_emu_shared);
    at_barrier = at_shuffle = exited = 0;
    memset(warp_arrived, 0, sizeof warp_arrived);
    for (int i = 0; i < nthreads; ++i) {
        Fiber* f = fibers + i;
        f->linear = i;
        f->tid.x = i % block_dim.x;
        f->tid.y = (i / block_dim.x) % block_dim.y;
        f->tid.z = i / (block_dim.x * block_dim.y);
        start_fiber(f);
        order[i] = schedule == 1 ? nthreads - 1 - i : i;
    }
    rng_state = seed ^ (0x9e3779b97f4a7c15ull * (1 + block_idx.x + 65536ull * (block_idx.y + 65536ull * block_idx.z)));
    if (rng_state == 0) rng_state = 1;
    while (exited < nthreads) {
        if (schedule == 2)
            for (int i = nthreads - 1; i > 0; --i) {
                const int j = (int)(next_random() % (uint64_t)(i + 1));
                const int t = order[i];
                order[i] = order[j];
                order[j] = t;
            }
        pass_pos = -1;
        Fiber* first = next_in_pass();
        if (!first) {
            fail_deadlock("deadlock");
            return 1;
        }
        run(first);  // returns when the pass is over
        if (failed) return 1;
    }
    return 0;
}

}  // namespace emu

EMU_EXPORT int emu_abi_version() { return 1; }

EMU_EXPORT unsigned long long emu_shared_bytes() { return (unsigned long long)(__stop_emu_shared - __start_emu_shared); }

// Runs one launch to completion: 0, or 1 with the reason in `err`.
EMU_EXPORT int emu_launch(void (*tramp)(void**), unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                          unsigned bz, unsigned dynamic_shared, void** args, int schedule, unsigned long long seed,
                          char* err, unsigned long err_len) {
    using namespace emu;
    failed = false;
    error_text[0] = 0;
    const unsigned long long threads = (unsigned long long)bx * by * bz;
    const unsigned long long shared = emu_shared_bytes();
    if (gx == 0 || gy == 0 || gz == 0 || bx == 0 || by == 0 || bz == 0)
        fail("invalid launch configuration: a zero dimension (grid %u,%u,%u, block %u,%u,%u)", gx, gy, gz, bx, by, bz);
    else if (threads > 1024 || bx > 1024 || by > 1024 || bz > 64)
        fail("invalid launch configuration: block %u,%u,%u (%llu threads; at most 1024, z at most 64)", bx, by, bz,
             threads);
    else if (gx > 2147483647u || gy > 65535 || gz > 65535)
        fail("invalid launch configuration: grid %u,%u,%u (grid y/z > 65535 or x > 2^31-1)", gx, gy, gz);
    else if (dynamic_shared > 0)
        fail("dynamic shared memory (%u bytes) is not emulated", dynamic_shared);
    else if (shared > 48 * 1024)
        fail("static shared memory %llu bytes > 48 KiB", shared);
    else if (!ensure_pool((int)threads))
        fail("cannot map stacks for %llu fibers", threads);
    int rc = failed ? 1 : 0;
#if defined(__SANITIZE_ADDRESS__)
    if (!rc) {
        // The launching thread's stack, where the fibers hand back to the scheduler.
        pthread_attr_t attr;
        void* addr = nullptr;
        size_t size = 0;
        if (pthread_getattr_np(pthread_self(), &attr) == 0) {
            pthread_attr_getstack(&attr, &addr, &size);
            pthread_attr_destroy(&attr);
        }
        sched_stack_bottom = addr;
        sched_stack_size = size;
    }
#endif
    if (!rc) {
        order = (int*)malloc(sizeof(int) * threads);
        emu::entry = tramp;
        emu::entry_args = args;
        nthreads = (int)threads;
        block_dim = {bx, by, bz};
        grid_dim = {gx, gy, gz};
        for (unsigned z = 0; z < gz && !rc; ++z)
            for (unsigned y = 0; y < gy && !rc; ++y)
                for (unsigned x = 0; x < gx && !rc; ++x) {
                    block_idx = {x, y, z};
                    rc = run_block(schedule, seed);
                }
        free(order);
        order = nullptr;
    }
    if (rc) snprintf(err, err_len, "%s", error_text);
    return rc;
}
