//! The synchronization the engine uses: locks, condition variables,
//! channels and threads, from one place. Built normally they are
//! parking_lot's locks, crossbeam's channels and std's threads, unchanged.
//! Built with the `shuttle` feature they are wrappers over the shuttle
//! crate's, with the same interface, so the engine's own code runs under
//! shuttle's scheduler, which picks the interleaving of every thread at every
//! lock, wait and channel operation and replays a failing one from its seed
//! (`tests/schedules.rs`).
//!
//! Rule for the rest of the crate: every lock that is held across a wait,
//! a channel operation or another lock of the engine, and every thread and
//! channel, comes from here. Leaf locks inside one member (the simulated
//! drive's image, the recording log), held only to copy bytes, may stay
//! parking_lot's: they never yield to the scheduler while held. So do the
//! volume maps' and the segments' row lists' read-write locks
//! (`pool::read_index`): leaves, held for lookups and updates only, never
//! across a scheduling point.

#[cfg(not(feature = "shuttle"))]
mod real {
    use lograid_latency::stripe::{Striped, STRIPES};
    pub use parking_lot::{Condvar, Mutex, MutexGuard, RwLock};

    /// A read-write lock (no data) for readers on every request and a rare
    /// writer: a reader takes the stripe of the CPU it runs on
    /// (`lograid_latency::stripe`), so readers on different cores write no
    /// shared cache line; a writer takes every stripe, in order (while it
    /// waits for one stripe's readers, those it has taken admit no new
    /// readers and the later ones still do: its wait is the sum of the
    /// longest reads on each).
    #[derive(Default)]
    pub struct ReadMostlyLock(Striped<RwLock<()>>);

    /// A reader's hold on one stripe.
    pub type ReadMostlyReadGuard<'a> = parking_lot::RwLockReadGuard<'a, ()>;
    /// A writer's hold on every stripe.
    pub type ReadMostlyWriteGuard<'a> = [parking_lot::RwLockWriteGuard<'a, ()>; STRIPES];

    impl ReadMostlyLock {
        pub fn read(&self) -> ReadMostlyReadGuard<'_> {
            self.0.local().read()
        }
        pub fn try_read(&self) -> Option<ReadMostlyReadGuard<'_>> {
            self.0.local().try_read()
        }
        pub fn write(&self) -> ReadMostlyWriteGuard<'_> {
            self.0.each(RwLock::write)
        }
    }

    /// Threads: std's.
    pub mod thread {
        pub use std::thread::{scope, sleep, yield_now, Builder, JoinHandle};
    }

    /// `f(0)`, .., `f(n - 1)`, in order: each on a thread of its own while
    /// this one waits (a single part runs on this thread). This thread
    /// taking a part itself made the opening's check on two cores about as
    /// slow as on one, likely because a new thread first runs on its
    /// parent's CPU. A part whose thread the system refuses runs on this
    /// thread instead; a panic in any part goes on in the caller.
    pub fn parallel<T: Send>(n: usize, f: impl Fn(usize) -> T + Sync) -> Vec<T> {
        if n <= 1 {
            return (0..n).map(f).collect();
        }
        let f = &f;
        std::thread::scope(|scope| {
            let started: Vec<Result<std::thread::ScopedJoinHandle<'_, T>, usize>> = (0..n)
                .map(|i| {
                    std::thread::Builder::new()
                        .spawn_scoped(scope, move || f(i))
                        .map_err(|_| i)
                })
                .collect();
            started
                .into_iter()
                .map(|s| match s {
                    Ok(handle) => handle
                        .join()
                        .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
                    Err(i) => f(i),
                })
                .collect()
        })
    }

    /// Threads worth starting for work split by CPU.
    pub fn available_cpus() -> usize {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    }

    /// Where a protocol acts on what it decided without a lock of this
    /// module held: nothing here; under shuttle, a point where the
    /// scheduler may run another thread.
    #[inline(always)]
    pub fn schedule_point() {}

    /// Multi-producer, multi-consumer channels: crossbeam's.
    pub mod channel {
        pub use crossbeam_channel::{bounded, unbounded, Receiver, SendError, Sender};
    }
}

#[cfg(not(feature = "shuttle"))]
pub use real::*;

#[cfg(feature = "shuttle")]
pub use scheduled::*;

#[cfg(feature = "shuttle")]
mod scheduled {
    use std::ops::{Deref, DerefMut};
    use std::time::Duration;

    /// A mutex with parking_lot's interface over shuttle's (a panic while
    /// it is held does not poison it, as with parking_lot).
    #[derive(Default)]
    pub struct Mutex<T: ?Sized>(shuttle::sync::Mutex<T>);

    /// Its guard: an `Option` so that a condition variable can hand the
    /// inner guard to shuttle's wait and put back the one it returns.
    pub struct MutexGuard<'a, T: ?Sized>(Option<shuttle::sync::MutexGuard<'a, T>>);

    impl<T> Mutex<T> {
        pub fn new(value: T) -> Mutex<T> {
            Mutex(shuttle::sync::Mutex::new(value))
        }
        pub fn into_inner(self) -> T {
            self.0.into_inner().unwrap_or_else(|e| e.into_inner())
        }
    }

    impl<T: ?Sized> Mutex<T> {
        pub fn lock(&self) -> MutexGuard<'_, T> {
            MutexGuard(Some(self.0.lock().unwrap_or_else(|e| e.into_inner())))
        }
        pub fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
            match self.0.try_lock() {
                Ok(g) => Some(MutexGuard(Some(g))),
                Err(std::sync::TryLockError::Poisoned(e)) => Some(MutexGuard(Some(e.into_inner()))),
                Err(std::sync::TryLockError::WouldBlock) => None,
            }
        }
        pub fn get_mut(&mut self) -> &mut T {
            self.0.get_mut().unwrap_or_else(|e| e.into_inner())
        }
    }

    impl<T: ?Sized> Deref for MutexGuard<'_, T> {
        type Target = T;
        fn deref(&self) -> &T {
            self.0.as_ref().expect("guard held")
        }
    }

    impl<T: ?Sized> DerefMut for MutexGuard<'_, T> {
        fn deref_mut(&mut self) -> &mut T {
            self.0.as_mut().expect("guard held")
        }
    }

    /// What a timed wait returned.
    pub struct WaitTimeoutResult(bool);

    impl WaitTimeoutResult {
        pub fn timed_out(&self) -> bool {
            self.0
        }
    }

    /// A condition variable with parking_lot's interface. Timed waits
    /// never time out under shuttle (they wait for a notification).
    #[derive(Default)]
    pub struct Condvar(shuttle::sync::Condvar);

    impl Condvar {
        pub fn new() -> Condvar {
            Condvar(shuttle::sync::Condvar::new())
        }
        pub fn wait<T>(&self, guard: &mut MutexGuard<'_, T>) {
            let inner = guard.0.take().expect("guard held");
            guard.0 = Some(self.0.wait(inner).unwrap_or_else(|e| e.into_inner()));
        }
        pub fn wait_for<T>(
            &self,
            guard: &mut MutexGuard<'_, T>,
            timeout: Duration,
        ) -> WaitTimeoutResult {
            let inner = guard.0.take().expect("guard held");
            let (inner, result) = self
                .0
                .wait_timeout(inner, timeout)
                .unwrap_or_else(|e| e.into_inner());
            guard.0 = Some(inner);
            WaitTimeoutResult(result.timed_out())
        }
        pub fn notify_one(&self) {
            self.0.notify_one()
        }
        pub fn notify_all(&self) {
            self.0.notify_all()
        }
    }

    /// A read-write lock with parking_lot's interface.
    #[derive(Default)]
    pub struct RwLock<T: ?Sized>(shuttle::sync::RwLock<T>);

    impl<T> RwLock<T> {
        pub fn new(value: T) -> RwLock<T> {
            RwLock(shuttle::sync::RwLock::new(value))
        }
    }

    impl<T: ?Sized> RwLock<T> {
        pub fn read(&self) -> shuttle::sync::RwLockReadGuard<'_, T> {
            self.0.read().unwrap_or_else(|e| e.into_inner())
        }
        pub fn try_read(&self) -> Option<shuttle::sync::RwLockReadGuard<'_, T>> {
            match self.0.try_read() {
                Ok(guard) => Some(guard),
                Err(std::sync::TryLockError::Poisoned(e)) => Some(e.into_inner()),
                Err(std::sync::TryLockError::WouldBlock) => None,
            }
        }
        pub fn write(&self) -> shuttle::sync::RwLockWriteGuard<'_, T> {
            self.0.write().unwrap_or_else(|e| e.into_inner())
        }
    }

    /// `ReadMostlyLock` under shuttle: one lock (which stripe a reader takes
    /// would depend on the CPU, and a replay must not).
    #[derive(Default)]
    pub struct ReadMostlyLock(RwLock<()>);

    pub type ReadMostlyReadGuard<'a> = shuttle::sync::RwLockReadGuard<'a, ()>;
    pub type ReadMostlyWriteGuard<'a> = shuttle::sync::RwLockWriteGuard<'a, ()>;

    impl ReadMostlyLock {
        pub fn read(&self) -> ReadMostlyReadGuard<'_> {
            self.0.read()
        }
        pub fn try_read(&self) -> Option<ReadMostlyReadGuard<'_>> {
            self.0.try_read()
        }
        pub fn write(&self) -> ReadMostlyWriteGuard<'_> {
            self.0.write()
        }
    }

    /// Threads: shuttle's (a sleep is a yield to the scheduler).
    pub mod thread {
        pub use shuttle::thread::{scope, sleep, yield_now, Builder, JoinHandle};
    }

    /// `parallel` under shuttle: in turn on this thread (the work it splits
    /// takes no lock of this module).
    pub fn parallel<T: Send>(n: usize, f: impl Fn(usize) -> T + Sync) -> Vec<T> {
        (0..n).map(f).collect()
    }

    /// One: a replay must not depend on the machine.
    pub fn available_cpus() -> usize {
        1
    }

    /// A point where the scheduler may run another thread.
    pub fn schedule_point() {
        shuttle::thread::yield_now();
    }

    /// Channels with crossbeam's interface over shuttle's: any number of
    /// receivers share one queue (each message goes to one of them).
    pub mod channel {
        use std::sync::Arc;

        pub struct SendError<T>(pub T);

        impl<T> std::fmt::Debug for SendError<T> {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("SendError(..)")
            }
        }

        #[derive(Debug)]
        pub struct RecvError;

        enum Inner<T> {
            Bounded(shuttle::sync::mpsc::SyncSender<T>),
            Unbounded(shuttle::sync::mpsc::Sender<T>),
        }

        pub struct Sender<T>(Inner<T>);

        impl<T> Clone for Sender<T> {
            fn clone(&self) -> Self {
                Sender(match &self.0 {
                    Inner::Bounded(s) => Inner::Bounded(s.clone()),
                    Inner::Unbounded(s) => Inner::Unbounded(s.clone()),
                })
            }
        }

        impl<T> Sender<T> {
            pub fn send(&self, value: T) -> Result<(), SendError<T>> {
                match &self.0 {
                    Inner::Bounded(s) => s.send(value).map_err(|e| SendError(e.0)),
                    Inner::Unbounded(s) => s.send(value).map_err(|e| SendError(e.0)),
                }
            }
        }

        pub struct Receiver<T>(Arc<super::Mutex<shuttle::sync::mpsc::Receiver<T>>>);

        impl<T> Clone for Receiver<T> {
            fn clone(&self) -> Self {
                Receiver(self.0.clone())
            }
        }

        impl<T> Receiver<T> {
            pub fn recv(&self) -> Result<T, RecvError> {
                self.0.lock().recv().map_err(|_| RecvError)
            }
            pub fn iter(&self) -> impl Iterator<Item = T> + '_ {
                std::iter::from_fn(move || self.recv().ok())
            }
        }

        impl<T: 'static> IntoIterator for Receiver<T> {
            type Item = T;
            type IntoIter = Box<dyn Iterator<Item = T>>;
            fn into_iter(self) -> Self::IntoIter {
                Box::new(std::iter::from_fn(move || self.recv().ok()))
            }
        }

        fn receiver<T>(r: shuttle::sync::mpsc::Receiver<T>) -> Receiver<T> {
            Receiver(Arc::new(super::Mutex::new(r)))
        }

        pub fn bounded<T>(capacity: usize) -> (Sender<T>, Receiver<T>) {
            let (s, r) = shuttle::sync::mpsc::sync_channel(capacity);
            (Sender(Inner::Bounded(s)), receiver(r))
        }

        pub fn unbounded<T>() -> (Sender<T>, Receiver<T>) {
            let (s, r) = shuttle::sync::mpsc::channel();
            (Sender(Inner::Unbounded(s)), receiver(r))
        }
    }
}

#[cfg(all(test, not(feature = "shuttle")))]
mod tests {
    use super::parallel;

    #[test]
    fn parallel_work_comes_back_in_order_and_a_panic_goes_on_in_the_caller() {
        assert_eq!(parallel(5, |i| i * 10), vec![0, 10, 20, 30, 40]);
        assert!(parallel(0, |i| i).is_empty());
        let caught = std::panic::catch_unwind(|| {
            parallel(3, |i| {
                assert_ne!(i, 2, "part two fails");
                i
            })
        });
        let message = caught.expect_err("the panic reached the caller");
        let text = message
            .downcast_ref::<String>()
            .cloned()
            .unwrap_or_default();
        assert!(text.contains("part two fails"), "{text}");
    }
}
