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
pub(crate) fn run<R: Send>(pass: impl FnOnce() -> R + Send) -> R {
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

/// How long a helper spins without finding a job before it gives up and returns to rayon's own
/// waiting: longer than the gaps between a decode step's loops (tens of µs).
///
/// It is what makes spinning safe. Rayon looks in a worker's broadcast queue before it steals,
/// but a helper that was already looking for work when the pass began can steal one of the
/// leader's jobs before its spinning job arrives. If that stolen job then waits on a join, the
/// helper takes its spinning job there, on top of the stolen one: spinning until the pass ends
/// would wait for a leader that waits for the job beneath the spinner — a deadlock (a CI run of
/// `tests/demo.rs` hung so; `the_race_of_a_helper_stealing_before_it_spins_ends` reproduces it:
/// without this limit it hung in 3 of 4 runs here, with it 4 of 4 finished in 11–12 s). When the
/// leader waits like that it pushes no more jobs, so the helper finds none and, after this long,
/// returns; the job beneath it finishes and the pass goes on.
const IDLE_LIMIT: std::time::Duration = std::time::Duration::from_micros(500);

/// How many times a helper has given up on [`IDLE_LIMIT`] (read by the tests, to say how often
/// the race happened).
static GAVE_UP: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Takes the pool's pending jobs (the leader's loops) until `done`, or until it has found none
/// for [`IDLE_LIMIT`].
fn spin_until(done: &AtomicBool) {
    let mut idle_since: Option<std::time::Instant> = None;
    while !done.load(Ordering::Acquire) {
        if let Some(rayon::Yield::Executed) = rayon::yield_now() {
            idle_since = None;
            continue;
        }
        let since = *idle_since.get_or_insert_with(std::time::Instant::now);
        if since.elapsed() > IDLE_LIMIT {
            GAVE_UP.fetch_add(1, Ordering::Relaxed);
            return;
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

    /// Passes from three threads at once on a two-thread pool, each four short parallel loops
    /// (a decode step's shape in miniature), 200 000 each: helpers are often looking for work as a
    /// pass begins, so some steal a leader's job before they take their spinning job and spin on
    /// top of it (see [`super::IDLE_LIMIT`]). Every pass must finish, with the right sums.
    #[test]
    fn the_race_of_a_helper_stealing_before_it_spins_ends() {
        const PASSES: u64 = 200_000;
        let pool = std::sync::Arc::new(rayon::ThreadPoolBuilder::new().num_threads(2).build().expect("a pool"));
        let gave_up_before = super::GAVE_UP.load(std::sync::atomic::Ordering::Relaxed);
        let (tx, rx) = std::sync::mpsc::channel();
        for t in 0..3u64 {
            let (pool, tx) = (pool.clone(), tx.clone());
            std::thread::spawn(move || {
                let mut wrong = 0u64;
                for i in 0..PASSES {
                    let sum = pool.install(|| {
                        super::run(|| {
                            let mut sum = 0;
                            for l in 0..4u64 {
                                let mut v = vec![0u64; 1024];
                                v.par_chunks_mut(16).enumerate().for_each(|(c, ch)| {
                                    for (j, x) in ch.iter_mut().enumerate() {
                                        *x = (i + l + t + (c * 16 + j) as u64) % 7;
                                    }
                                });
                                sum += v.iter().sum::<u64>();
                            }
                            sum
                        })
                    });
                    let expected: u64 = (0..4u64).map(|l| (0..1024u64).map(|j| (i + l + t + j) % 7).sum::<u64>()).sum();
                    wrong += u64::from(sum != expected);
                }
                let _ = tx.send(wrong);
            });
        }
        drop(tx);
        for _ in 0..3 {
            let got = rx.recv_timeout(std::time::Duration::from_secs(180));
            assert_eq!(got, Ok(0), "a thread's passes did not all finish within 180 s (deadlocked), or summed wrong");
        }
        let gave_up = super::GAVE_UP.load(std::sync::atomic::Ordering::Relaxed) - gave_up_before;
        eprintln!("helpers gave up spinning {gave_up} times over {} passes", 3 * PASSES);
    }
}
