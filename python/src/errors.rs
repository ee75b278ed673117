//! The Python exceptions of the package and the mapping of the crate's `Error` onto them.
//!
//! They live in module `rollout_buffer` (which re-exports them): an exception pickled in a
//! Ray task or a multiprocessing worker is found again by that name, so `except
//! rollout_buffer.Timeout` catches it in the caller.

use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyTimeoutError, PyValueError};
use pyo3::prelude::*;
use rollout_buffer::Error;

create_exception!(
    rollout_buffer,
    BufferError,
    PyException,
    "An error of the buffer."
);
create_exception!(
    rollout_buffer,
    BufferFull,
    BufferError,
    "No room now (`try_put_batch`)."
);
create_exception!(rollout_buffer, Closed, BufferError, "The buffer is closed.");
create_exception!(
    rollout_buffer,
    StaleHandle,
    BufferError,
    "A handle names a freed or reused slot."
);
create_exception!(
    rollout_buffer,
    SamplesDropped,
    BufferError,
    "Samples a read could not use were dropped from the buffer; the cause says why."
);
create_exception!(
    rollout_buffer,
    Timeout,
    PyTimeoutError,
    "A wait timed out; nothing was changed."
);

/// The Python exception for a buffer error: bad input is `ValueError`.
pub(crate) fn py_err(e: Error) -> PyErr {
    let msg = e.to_string();
    match e {
        Error::Full { .. } | Error::Backlog { .. } => BufferFull::new_err(msg),
        Error::Closed => Closed::new_err(msg),
        Error::Timeout { .. } => Timeout::new_err(msg),
        Error::StaleHandle { .. } => StaleHandle::new_err(msg),
        Error::DuplicateId { .. }
        | Error::MissingKey { .. }
        | Error::InvalidBirth { .. }
        | Error::BatchTooLarge { .. }
        | Error::LengthMismatch { .. }
        | Error::UndeclaredOutput { .. }
        | Error::MissingOutput { .. }
        | Error::UnknownRpc { .. }
        | Error::FutureVersion { .. }
        | Error::InvalidMetadata { .. }
        | Error::InvalidSelection { .. }
        | Error::InvalidRateLimit { .. }
        | Error::RateLimitedPut { .. }
        | Error::InvalidRollout { .. }
        | Error::OverBudget { .. }
        | Error::VersionRegressed { .. }
        // Configuration refused: bad arguments, as Python's own calls answer them.
        | Error::InvalidCapacity { .. }
        | Error::NoRpcs
        | Error::DuplicateRpc { .. }
        | Error::InvalidNSeqs { .. }
        | Error::InvalidReads { .. }
        | Error::InvalidPacking { .. }
        | Error::DuplicateProducer { .. }
        | Error::ExternalKeyProduced { .. }
        | Error::CyclicGraph { .. }
        | Error::InvalidSlot { .. }
        | Error::DuplicateHandle { .. }
        | Error::RaggedLengths { .. }
        | Error::InvalidConfig { .. }
        // Data that makes no Arrow column (a field of mixed types, an unsupported type).
        | Error::Arrow { .. } => PyValueError::new_err(msg),
        _ => BufferError::new_err(msg),
    }
}
