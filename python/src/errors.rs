//! The Python exceptions of the package and the mapping of the crate's `Error` onto them.

use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyTimeoutError, PyValueError};
use pyo3::prelude::*;
use rollout_buffer::Error;

create_exception!(_native, BufferError, PyException, "An error of the buffer.");
create_exception!(
    _native,
    BufferFull,
    BufferError,
    "No room now (`try_put_batch`)."
);
create_exception!(_native, Closed, BufferError, "The buffer is closed.");
create_exception!(
    _native,
    StaleHandle,
    BufferError,
    "A handle names a freed or reused slot."
);
create_exception!(
    _native,
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
        | Error::RaggedLengths { .. }
        | Error::InvalidConfig { .. }
        // Data that makes no Arrow column (a field of mixed types, an unsupported type).
        | Error::Arrow { .. } => PyValueError::new_err(msg),
        _ => BufferError::new_err(msg),
    }
}
