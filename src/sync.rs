//! The one place that names synchronisation primitives.
//!
//! Normal builds use `std::sync` and `tokio::sync::Notify`. Under the crate-specific cfg
//! `rollout_buffer_loom` every primitive comes from `loom`, and `Notify` is a small
//! loom-visible stand-in with the subset of tokio's API the buffer uses (`notified()`,
//! `Notified::enable()`, `notify_waiters()`). tokio's own `Notify` is built on std atomics,
//! so inside `loom::model` the window between "check state" and "register as a waiter" would
//! be invisible and loom could not find a lost wake-up. The stand-in keeps that window
//! inside a loom mutex, where loom explores it.
//!
//! The rest of the crate imports its primitives from here (`Arc`, `Mutex`, `Notify`,
//! `AtomicBool`, `AtomicU64`, `Ordering`, `Weak`, and the archive task's `mpsc` /
//! `oneshot`) and never names `std::sync`, `loom` or `tokio::sync` itself; `tests/layout.rs`
//! checks that, and `clippy.toml` makes clippy refuse std's and tokio's primitives elsewhere.

/// Reference counting is not part of any wake-up protocol, and loom's `Arc` cannot be made
/// outside a model (samples are built there too), so it is std's `Arc` in every build.
pub(crate) use std::sync::Arc;

/// Memory orderings are plain values shared by std and loom atomics.
pub(crate) use std::sync::atomic::Ordering;

#[cfg(not(rollout_buffer_loom))]
pub(crate) use std::sync::atomic::AtomicBool;

#[cfg(rollout_buffer_loom)]
pub(crate) use loom::sync::atomic::AtomicBool;

#[cfg(not(rollout_buffer_loom))]
pub(crate) use tokio::sync::Notify;

/// Channels to the archive's writer task (not part of the slot protocol; never under loom,
/// whose build has no `persist`).
#[cfg(feature = "persist")]
pub(crate) use tokio::sync::mpsc;

/// Counters outside the slot protocol (the process-wide birth counter, the log's backlog,
/// spill segment ids): std's in every build, so they also work outside a loom model.
pub(crate) use std::sync::atomic::AtomicU64;

/// Weak handles of the background tasks (the spiller, loads, the group sealer) to the
/// buffer they serve; reference counting is outside every wake-up protocol, as for `Arc`.
pub(crate) use std::sync::Weak;

/// A durable change's result travels from the journal's writer to its caller through a
/// oneshot; it is not part of the slot protocol (the slot state changes under the buffer's
/// lock before the result is sent), so it is tokio's in every build.
pub(crate) use tokio::sync::oneshot;

#[cfg(rollout_buffer_loom)]
pub(crate) use self::loom_notify::Notify;

/// A mutex whose `lock()` never fails.
///
/// The buffer never panics while holding its lock on purpose; should a panic happen anyway
/// (a bug), the state is still checked by `check_invariants()`, so poisoning is not
/// propagated as a second panic in every later caller.
#[derive(Debug)]
pub(crate) struct Mutex<T> {
    #[cfg(not(rollout_buffer_loom))]
    inner: std::sync::Mutex<T>,
    #[cfg(rollout_buffer_loom)]
    inner: loom::sync::Mutex<T>,
}

/// Guard returned by [`Mutex::lock`].
#[cfg(not(rollout_buffer_loom))]
pub(crate) type MutexGuard<'a, T> = std::sync::MutexGuard<'a, T>;
/// Guard returned by [`Mutex::lock`].
#[cfg(rollout_buffer_loom)]
pub(crate) type MutexGuard<'a, T> = loom::sync::MutexGuard<'a, T>;

impl<T> Mutex<T> {
    pub(crate) fn new(value: T) -> Self {
        Self {
            #[cfg(not(rollout_buffer_loom))]
            inner: std::sync::Mutex::new(value),
            #[cfg(rollout_buffer_loom)]
            inner: loom::sync::Mutex::new(value),
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl<T: Default> Default for Mutex<T> {
    fn default() -> Self {
        Self::new(T::default())
    }
}

#[cfg(rollout_buffer_loom)]
mod loom_notify {
    //! A loom-visible `Notify` with tokio's `notify_waiters` semantics: a `Notified` future
    //! created before a `notify_waiters()` call completes, whether or not it was polled or
    //! enabled by then.

    use loom::sync::Mutex;
    use std::future::Future;
    use std::pin::Pin;
    use std::task::{Context, Poll, Waker};

    #[derive(Debug, Default)]
    struct State {
        /// Number of `notify_waiters()` calls so far.
        epoch: u64,
        /// Wakers of pending futures, tagged with a per-future id.
        wakers: Vec<(u64, Waker)>,
        next_id: u64,
    }

    #[derive(Debug, Default)]
    pub(crate) struct Notify {
        state: Mutex<State>,
    }

    impl Notify {
        pub(crate) fn new() -> Self {
            Self::default()
        }

        pub(crate) fn notified(&self) -> Notified<'_> {
            let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            let id = state.next_id;
            state.next_id += 1;
            Notified {
                notify: self,
                epoch: state.epoch,
                id,
            }
        }

        pub(crate) fn notify_waiters(&self) {
            let wakers = {
                let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
                state.epoch += 1;
                std::mem::take(&mut state.wakers)
            };
            for (_, waker) in wakers {
                waker.wake();
            }
        }
    }

    #[derive(Debug)]
    pub(crate) struct Notified<'a> {
        notify: &'a Notify,
        epoch: u64,
        id: u64,
    }

    impl Notified<'_> {
        /// The epoch was captured at creation, which is all `notify_waiters` needs.
        pub(crate) fn enable(self: Pin<&mut Self>) -> bool {
            let state = self.notify.state.lock().unwrap_or_else(|e| e.into_inner());
            state.epoch != self.epoch
        }
    }

    impl Future for Notified<'_> {
        type Output = ();

        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            let mut state = self.notify.state.lock().unwrap_or_else(|e| e.into_inner());
            if state.epoch != self.epoch {
                return Poll::Ready(());
            }
            let id = self.id;
            match state.wakers.iter_mut().find(|(i, _)| *i == id) {
                Some((_, w)) => w.clone_from(cx.waker()),
                None => state.wakers.push((id, cx.waker().clone())),
            }
            Poll::Pending
        }
    }

    impl Drop for Notified<'_> {
        fn drop(&mut self) {
            let mut state = self.notify.state.lock().unwrap_or_else(|e| e.into_inner());
            let id = self.id;
            state.wakers.retain(|(i, _)| *i != id);
        }
    }
}
