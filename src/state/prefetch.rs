//! A cache-line prefetch hint, for the passes that load what a whole batch will touch
//! before the batch's transitions run: in a buffer of a million samples each slot's lines
//! are cold, and misses issued together overlap where misses met one by one each wait.

/// Asks the CPU to start loading the cache line holding `value`, without waiting for it.
/// A hint only: on targets without one it does nothing.
#[inline(always)]
pub(crate) fn prefetch<T>(value: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads nothing architecturally and cannot fault; the pointer comes
    // from a live reference anyway.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(std::ptr::from_ref(value).cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = value;
}
