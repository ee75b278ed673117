//! RPC definitions and the dataflow graph they form.
//!
//! An RPC ("remote procedure call", a model function call in AReaL's terms: generation, a
//! reward model, a trainer) reads some data keys of a sample and may write others. This
//! module owns [`RpcDef`], the validation of a list of them (unique names, a sane batch size,
//! one producer per key, no cycles) and the interning of key names into small integer ids so
//! that the state machine works on `u64` key sets instead of strings. It knows nothing of
//! slots, waiting or storage.

mod def;
mod graph;

pub use def::{RateLimit, RpcDef, Selection};
pub(crate) use graph::{KeySet, RpcGraph, RpcInfo, RpcSet};
