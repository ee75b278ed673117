//! `Sample` (one rollout or prompt in the buffer), its `SampleId`, metadata values, and
//! `Patch` (the fields an amend or an RPC's completion adds).
//!
//! Fields are [`Tensor`]s keyed by name; a sample holds few of them (a handful of keys per
//! RL pipeline), so they live in a small vector rather than a map. Field names are
//! [`FieldKey`]s: a string literal costs no allocation, any other name is an `Arc<str>`
//! shared by every copy. Ids are `Arc<str>` with their hash computed once.

use crate::error::Unstored;
use crate::sync::{Arc, AtomicU64, Ordering};
use crate::tensor::Tensor;
use std::collections::BTreeMap;
use std::fmt;

/// The identity of a sample, unique among the samples in one buffer.
///
/// The id's hash is computed once, when the id is made, so the buffer's id index does no
/// hashing while it holds its lock.
#[derive(Clone)]
pub struct SampleId {
    hash: u64,
    text: Arc<str>,
}

impl SampleId {
    fn new(text: Arc<str>) -> Self {
        use std::hash::{Hash, Hasher};
        // SipHash with fixed keys: stable across processes, good spread; ids are chosen by
        // the caller's own pipeline, not by an adversary.
        let mut h = std::collections::hash_map::DefaultHasher::new();
        text.hash(&mut h);
        Self {
            hash: h.finish(),
            text,
        }
    }

    /// The id as a string.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl PartialEq for SampleId {
    fn eq(&self, other: &Self) -> bool {
        self.hash == other.hash && self.text == other.text
    }
}

impl Eq for SampleId {}

impl std::hash::Hash for SampleId {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

impl PartialOrd for SampleId {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for SampleId {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.text.cmp(&other.text)
    }
}

impl fmt::Debug for SampleId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.text, f)
    }
}

impl fmt::Display for SampleId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl From<&str> for SampleId {
    fn from(s: &str) -> Self {
        Self::new(s.into())
    }
}

impl From<String> for SampleId {
    fn from(s: String) -> Self {
        Self::new(s.into())
    }
}

impl From<u64> for SampleId {
    fn from(n: u64) -> Self {
        Self::new(n.to_string().into())
    }
}

/// Sample id -> slot, hashed with the ids' precomputed hashes.
pub(crate) type IdIndex =
    std::collections::HashMap<SampleId, u32, std::hash::BuildHasherDefault<PrehashedId>>;

/// A `Hasher` for keys that carry their own precomputed hash (`SampleId`): it passes the
/// `u64` through.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct PrehashedId(u64);

impl std::hash::Hasher for PrehashedId {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is used by `SampleId`; fold anything else in for safety.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// A metadata value: small typed facts about a sample (environment, policy version, ...).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum MetaValue {
    /// A signed integer.
    Int(i64),
    /// A float.
    Float(f64),
    /// A string.
    Str(String),
    /// A boolean.
    Bool(bool),
}

macro_rules! meta_from {
    ($($ty:ty => $variant:ident $(as $cast:ty)?),* $(,)?) => {$(
        impl From<$ty> for MetaValue {
            fn from(v: $ty) -> Self {
                MetaValue::$variant(v $(as $cast)? .into())
            }
        }
    )*};
}
meta_from!(i64 => Int, i32 => Int, u32 => Int, f64 => Float, f32 => Float, bool => Bool,
           String => Str, &str => Str);

/// The name of a field: a `&'static str` (no allocation, the common case of literal key
/// names) or a shared `Arc<str>`.
#[derive(Clone)]
pub struct FieldKey(KeyRepr);

#[derive(Clone)]
enum KeyRepr {
    Static(&'static str),
    Shared(Arc<str>),
}

impl FieldKey {
    /// The name.
    pub fn as_str(&self) -> &str {
        match &self.0 {
            KeyRepr::Static(s) => s,
            KeyRepr::Shared(s) => s,
        }
    }
}

impl std::ops::Deref for FieldKey {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl PartialEq for FieldKey {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for FieldKey {}

impl fmt::Debug for FieldKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for FieldKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl From<&'static str> for FieldKey {
    fn from(s: &'static str) -> Self {
        Self(KeyRepr::Static(s))
    }
}

impl From<String> for FieldKey {
    fn from(s: String) -> Self {
        Self(KeyRepr::Shared(s.into()))
    }
}

impl From<&String> for FieldKey {
    fn from(s: &String) -> Self {
        Self(KeyRepr::Shared(s.as_str().into()))
    }
}

impl From<Arc<str>> for FieldKey {
    fn from(s: Arc<str>) -> Self {
        Self(KeyRepr::Shared(s))
    }
}

/// Named fields, in insertion order; setting an existing key replaces its tensor.
#[derive(Debug, Clone, Default)]
pub(crate) struct Fields(Vec<(FieldKey, Tensor)>);

impl PartialEq for Fields {
    /// The same keys with equal tensors, in any order.
    fn eq(&self, other: &Self) -> bool {
        self.0.len() == other.0.len() && self.0.iter().all(|(k, v)| other.get(k) == Some(v))
    }
}

impl Fields {
    pub(crate) fn set(&mut self, key: FieldKey, value: Tensor) {
        match self.0.iter_mut().find(|(k, _)| *k == key) {
            Some((_, v)) => *v = value,
            None => self.0.push((key, value)),
        }
    }

    pub(crate) fn get(&self, key: &str) -> Option<&Tensor> {
        self.0
            .iter()
            .find(|(k, _)| k.as_str() == key)
            .map(|(_, v)| v)
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (&FieldKey, &Tensor)> {
        self.0.iter().map(|(k, v)| (k, v))
    }

    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    /// Takes the tensor of `key` out, if there is one.
    pub(crate) fn remove(&mut self, key: &str) -> Option<Tensor> {
        let i = self.0.iter().position(|(k, _)| k.as_str() == key)?;
        Some(self.0.swap_remove(i).1)
    }

    /// The fields `keep` accepts (given key and tensor), sharing their tensors.
    pub(crate) fn filtered_by(&self, mut keep: impl FnMut(&str, &Tensor) -> bool) -> Self {
        Self(self.0.iter().filter(|(k, t)| keep(k, t)).cloned().collect())
    }

    /// The fields whose key `keep` accepts, sharing their tensors.
    pub(crate) fn filtered(&self, mut keep: impl FnMut(&str) -> bool) -> Self {
        Self(self.0.iter().filter(|(k, _)| keep(k)).cloned().collect())
    }
}

impl IntoIterator for Fields {
    type Item = (FieldKey, Tensor);
    type IntoIter = std::vec::IntoIter<(FieldKey, Tensor)>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

/// One entry of the buffer: an id, a birth (smaller = older), named tensor fields and
/// metadata.
///
/// ```
/// use rollout_buffer::{Sample, Tensor};
/// let s = Sample::new("rollout-7")
///     .birth(42)
///     .with("prompt", Tensor::from(vec![1i32, 2, 3]))
///     .meta("environment", "math");
/// assert_eq!(s.get("prompt").and_then(|t| t.array::<i32>()).map(|a| a.len()), Some(3));
/// assert_eq!(s.birth_value(), Some(42));
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub(crate) id: SampleId,
    /// `None` until set explicitly or assigned by `put_batch` (next process-wide birth).
    pub(crate) birth: Option<u64>,
    pub(crate) fields: Fields,
    /// `None` when empty; shared so that copying a sample (copy-on-write when a batch still
    /// holds the previous version) copies no strings.
    pub(crate) meta: Option<Arc<BTreeMap<String, MetaValue>>>,
}

impl Sample {
    /// A sample with no fields; its birth is assigned at put unless set with [`Sample::birth`].
    pub fn new(id: impl Into<SampleId>) -> Self {
        Self {
            id: id.into(),
            birth: None,
            fields: Fields::default(),
            meta: None,
        }
    }

    /// Sets the birth: the order key, smaller = older = served first by `Fifo`. Must be > 0
    /// (a put rejects 0). AReaL uses the rollout's start time in milliseconds.
    pub fn birth(mut self, birth: u64) -> Self {
        self.birth = Some(birth);
        self
    }

    /// Adds or replaces a field.
    pub fn with(mut self, key: impl Into<FieldKey>, value: impl Into<Tensor>) -> Self {
        self.fields.set(key.into(), value.into());
        self
    }

    /// Adds or replaces a metadata entry.
    pub fn meta(mut self, key: &str, value: impl Into<MetaValue>) -> Self {
        self.meta_mut().insert(key.to_owned(), value.into());
        self
    }

    /// Bytes of tensor data in the sample's fields (what the byte budget counts).
    pub(crate) fn payload_bytes(&self) -> u64 {
        self.fields.iter().map(|(_, t)| t.nbytes() as u64).sum()
    }

    pub(crate) fn meta_mut(&mut self) -> &mut BTreeMap<String, MetaValue> {
        Arc::make_mut(self.meta.get_or_insert_with(Default::default))
    }

    /// The id.
    pub fn id(&self) -> &SampleId {
        &self.id
    }

    /// The birth: the value set with [`Sample::birth`] or, for samples read from the
    /// buffer, the one assigned at put; `None` for a new sample without one.
    pub fn birth_value(&self) -> Option<u64> {
        self.birth
    }

    /// A field.
    pub fn get(&self, key: &str) -> Option<&Tensor> {
        self.fields.get(key)
    }

    /// All fields, in the order they were added.
    pub fn fields(&self) -> impl Iterator<Item = (&str, &Tensor)> {
        self.fields.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// The field names.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.fields.iter().map(|(k, _)| k.as_str())
    }

    /// A metadata entry.
    pub fn get_meta(&self, key: &str) -> Option<&MetaValue> {
        self.meta.as_deref()?.get(key)
    }

    /// All metadata.
    pub fn metadata(&self) -> &BTreeMap<String, MetaValue> {
        static EMPTY: BTreeMap<String, MetaValue> = BTreeMap::new();
        self.meta.as_deref().unwrap_or(&EMPTY)
    }

    /// Applies a patch: its fields replace or add to this sample's, its metadata likewise.
    pub(crate) fn apply(&mut self, patch: &Patch) {
        for (k, v) in patch.fields.iter() {
            self.fields.set(k.clone(), v.clone());
        }
        if !patch.meta.is_empty() {
            let meta = self.meta_mut();
            for (k, v) in patch.meta.iter() {
                meta.insert(k.clone(), v.clone());
            }
        }
    }
}

/// Fields (and metadata) to add to a stored sample, by `amend_batch` or `Batch::complete`.
///
/// ```
/// use rollout_buffer::{Patch, Tensor};
/// let p = Patch::new().with("reward", 1.0f64);
/// let q: Patch = [("tokens", Tensor::from(vec![7i32]))].into_iter().collect();
/// assert_eq!(p.keys().collect::<Vec<_>>(), ["reward"]);
/// assert_eq!(q.len(), 1);
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Patch {
    pub(crate) fields: Fields,
    pub(crate) meta: BTreeMap<String, MetaValue>,
}

impl Patch {
    /// An empty patch.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds or replaces a field.
    pub fn with(mut self, key: impl Into<FieldKey>, value: impl Into<Tensor>) -> Self {
        self.fields.set(key.into(), value.into());
        self
    }

    /// Adds or replaces a metadata entry.
    pub fn meta(mut self, key: &str, value: impl Into<MetaValue>) -> Self {
        self.meta.insert(key.to_owned(), value.into());
        self
    }

    /// The field names.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.fields.iter().map(|(k, _)| k.as_str())
    }

    /// Number of fields.
    pub fn len(&self) -> usize {
        self.fields.len()
    }

    /// True when the patch has no fields and no metadata.
    pub fn is_empty(&self) -> bool {
        self.fields.len() == 0 && self.meta.is_empty()
    }
}

impl<K: Into<FieldKey>, V: Into<Tensor>> FromIterator<(K, V)> for Patch {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        iter.into_iter()
            .fold(Patch::new(), |p, (k, v)| p.with(k, v))
    }
}

impl Unstored {
    /// Samples handed back by a refused put.
    pub(crate) fn new(samples: Vec<Sample>) -> Self {
        if samples.is_empty() {
            return Self::default();
        }
        Self(Some(Arc::new(samples)))
    }

    /// The held samples. `Unstored` is only ever made from a `Vec<Sample>` (by `new`), so
    /// the downcast cannot fail; an empty slice stands for "none".
    fn held(&self) -> &[Sample] {
        self.0
            .as_ref()
            .and_then(|any| any.downcast_ref::<Vec<Sample>>())
            .map_or(&[], Vec::as_slice)
    }

    /// The samples, in the order they were given to the put.
    pub fn samples(&self) -> &[Sample] {
        self.held()
    }

    /// How many samples it holds.
    pub fn len(&self) -> usize {
        self.held().len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.held().is_empty()
    }

    /// The samples, in the order they were given to the put; moved out when this is the
    /// only copy of the error (the usual case), else cloned (tensors are shared, so a
    /// clone copies handles, not data).
    pub fn into_samples(self) -> Vec<Sample> {
        match self.0.map(|any| any.downcast::<Vec<Sample>>()) {
            Some(Ok(samples)) => {
                Arc::try_unwrap(samples).unwrap_or_else(|shared| (*shared).clone())
            }
            _ => Vec::new(),
        }
    }
}

impl fmt::Debug for Unstored {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Unstored({} samples)", self.len())
    }
}

impl PartialEq for Unstored {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len()
    }
}

/// Hands out `n` consecutive values of the process-wide birth counter and returns the first.
///
/// Births order samples oldest-first; a sample put without an explicit birth gets the next
/// value here, so default births follow put order across every buffer in the process. This
/// counter is not part of any wake-up protocol, so it stays a plain std atomic under loom.
pub(crate) fn next_births(n: u64) -> u64 {
    NEXT_BIRTH.fetch_add(n, Ordering::Relaxed)
}

/// Makes every later default birth larger than `birth` (a recovered buffer's samples keep
/// their births, and new samples must come after them).
#[cfg(feature = "persist")]
pub(crate) fn births_after(birth: u64) {
    NEXT_BIRTH.fetch_max(birth.saturating_add(1), Ordering::Relaxed);
}

static NEXT_BIRTH: AtomicU64 = AtomicU64::new(1);
