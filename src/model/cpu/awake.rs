//! A forward pass with the thread pool's other threads kept awake.
//!
//! A decode step is ~100 short parallel loops (one per linear layer, a few more) with a little
//! serial work between them. Between two loops rayon's idle workers go to sleep on a futex,
//! and the next loop waits for them to wake: measured on the 0.8B shape (2 cores), 1.8 of 2
//! CPUs busy and one context switch per loop. Here the pass runs on one worker (the leader)
//! while every other worker spins, taking the leader's loop jobs as soon as they are pushed,
//! until the pass ends. They spin only while a pass runs; between passes they sleep as before.

use std::sync::atomic::{AtomicBool, Ordering};

/// Set while a pass holds the pool; a second pass at the same time (another request on the
/// same pool) runs the plain way rather than queue behind the first one's spinners.
static HELD: AtomicBool = AtomicBool::new(false);

/// Runs `pass` on one of the pool's threads with the others spinning for its jobs (see the
/// module's comment). The result, and a panic, are `pass`'s own.
pub fn run<R: Send>(pass: impl FnOnce() -> R + Send) -> R {
    if rayon::current_num_threads() == 1
        || HELD.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_err()
    {
        return rayon::scope(|_| pass());
    }
    let _release = Release;
    let done = AtomicBool::new(false);
    rayon::scope(|s| {
        // The scope's body runs on a worker: that one leads, every other one spins. (Its own
        // copy of the broadcast job returns at once when it gets to it.)
        let leader = rayon::current_thread_index();
        let done = &done;
        s.spawn_broadcast(move |_, ctx| {
            if Some(ctx.index()) != leader {
                spin_until(done);
            }
        });
        let _done = SetOnDrop(done);
        pass()
    })
}

/// Takes the pool's pending jobs (the leader's loops) until `done`.
fn spin_until(done: &AtomicBool) {
    while !done.load(Ordering::Acquire) {
        if let Some(rayon::Yield::Executed) = rayon::yield_now() {
            continue;
        }
        // Not a tight loop on the leader's deque: each empty look touches its cache lines.
        for _ in 0..64 {
            std::hint::spin_loop();
        }
    }
}

struct SetOnDrop<'a>(&'a AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

struct Release;

impl Drop for Release {
    fn drop(&mut self) {
        HELD.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use rayon::prelude::*;

    #[test]
    fn a_pass_runs_once_with_its_parallel_loops_and_its_panic_is_its_own() {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(3).build().expect("a pool");
        pool.install(|| {
            let mut calls = 0;
            let sum = super::run(|| {
                calls += 1;
                (0..10_000u64).into_par_iter().map(|i| i * i).sum::<u64>()
                    + (0..100u64).into_par_iter().map(|i| i).sum::<u64>()
            });
            assert_eq!(calls, 1);
            assert_eq!(sum, (0..10_000u64).map(|i| i * i).sum::<u64>() + 4950);
            // Nested and concurrent passes run the plain way, not deadlock.
            let nested = super::run(|| super::run(|| (0..64u32).into_par_iter().sum::<u32>()));
            assert_eq!(nested, 2016);
            let panicked = std::panic::catch_unwind(|| super::run(|| panic!("inside the pass")));
            assert!(panicked.is_err());
            // The pool is usable again after a panicking pass.
            assert_eq!(super::run(|| 7), 7);
        });
    }
}
