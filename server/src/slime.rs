//! slime's rollout-buffer wire format on the library: trajectory items in, groups keyed
//! by `instance_id` out, through slime's validity, filter, normalization and padding
//! (`../shared/research/slime_marin_api.md` B.1).
//!
//! An item is stored as a rollout of environment `--environment`, example `instance_id`,
//! uid `uid`, with its `messages` and `extra_info` kept as JSON text in the rollout's
//! metadata. A read leases ready groups one at a time from the `train` RPC, processes
//! them, and then either commits them (the answer is sent) or, when the processed items
//! fall short of `batch_size`, gives the valid ones back: unlike slime, a read that
//! returns too little drops nothing. Groups that fail validity are archived as filtered.

use crate::answer::{Format, Items, OutItem};
use crate::api_error::ApiError;
use crate::nesting::{nesting, MAX_NESTING};
use rollout_buffer::rollout::{
    items_kept, process_groups, Advantage, GroupConfig, GroupHooks, RolloutRecord, TrainGroup,
    Validity, GROUP_INPUTS,
};
use rollout_buffer::{Batch, MetaValue, RpcDef, SequenceBuffer};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};
use std::collections::{HashMap, HashSet};
use std::time::Duration;

/// The RPC reads lease groups through.
pub const TRAIN_RPC: &str = "train";

/// The buffer's RPCs: `train`, one group per lease, oldest first (slime reads in arrival
/// order), with the group layout plus the items' JSON.
pub fn rpcs() -> Vec<RpcDef> {
    let mut inputs: Vec<&str> = GROUP_INPUTS.to_vec();
    inputs.extend(["meta/messages", "meta/extra_info"]);
    vec![RpcDef::new(TRAIN_RPC, 1)
        .inputs(inputs)
        .selection(rollout_buffer::Selection::Fifo)]
}

/// One trajectory item, as slime's generators POST it. `messages` and `extra_info` stay
/// JSON text: they are stored and sent back as they came, never rebuilt.
/// Both are borrowed from the request's body, so the text is copied once, into the record.
#[derive(Debug, Deserialize)]
pub struct Item<'a> {
    /// The rollout's uid.
    pub uid: String,
    /// The group key.
    pub instance_id: Value,
    /// The chat (an OpenAI message list).
    #[serde(borrow)]
    pub messages: &'a RawValue,
    /// The reward.
    pub reward: f64,
    /// Everything else the generator knows.
    #[serde(default, borrow)]
    pub extra_info: Option<&'a RawValue>,
}

/// The fields of `extra_info` the server reads.
#[derive(Debug, Default, Deserialize)]
struct Extra {
    #[serde(default)]
    timestamp: Option<Value>,
    #[serde(default)]
    policy_version: Option<Value>,
}

impl Item<'_> {
    /// The rollout this item is stored as, or a 400 naming what is wrong.
    pub fn into_record(self, environment: &str) -> Result<RolloutRecord, ApiError> {
        let instance_id = match &self.instance_id {
            Value::String(s) => s.clone(),
            // An integer is its decimal text. Any other number is refused: one past 64
            // bits arrives rounded to a float (two ids would meet in one group), and a
            // float's text is not the id slime's Python keys by (`1e2` is `100.0`).
            Value::Number(n) if n.is_i64() || n.is_u64() => n.to_string(),
            Value::Number(n) => {
                return Err(ApiError::bad(format!(
                    "item {}: `instance_id` {n} is not an integer of 64 bits: send it as a \
                     string",
                    self.uid
                )))
            }
            other => {
                return Err(ApiError::bad(format!(
                    "item {}: `instance_id` must be a non-empty string or a number, not {other}",
                    self.uid
                )))
            }
        };
        let extra_info = self.extra_info.map(RawValue::get);
        ItemText {
            uid: self.uid,
            instance_id,
            messages: self.messages.get(),
            reward: self.reward,
            extra_info,
        }
        .into_record(environment)
    }
}

/// An item's fields as text, however it arrived (a JSON item, an Arrow row): `messages`
/// and `extra_info` are JSON text.
#[derive(Debug)]
pub struct ItemText<'a> {
    /// The rollout's uid.
    pub uid: String,
    /// The group key.
    pub instance_id: String,
    /// The message list, as JSON text.
    pub messages: &'a str,
    /// The reward.
    pub reward: f64,
    /// An object, as JSON text (`None` or `null`: none).
    pub extra_info: Option<&'a str>,
}

impl ItemText<'_> {
    /// The rollout this item is stored as, or a 400 naming what is wrong.
    pub fn into_record(self, environment: &str) -> Result<RolloutRecord, ApiError> {
        if self.uid.is_empty() {
            return Err(ApiError::bad("item: `uid` is empty"));
        }
        if self.instance_id.is_empty() {
            return Err(ApiError::bad(format!(
                "item {}: `instance_id` must be a non-empty string or a number",
                self.uid
            )));
        }
        if !self.messages.starts_with('[') {
            return Err(ApiError::bad(format!(
                "item {}: `messages` must be a list",
                self.uid
            )));
        }
        if !self.reward.is_finite() {
            return Err(ApiError::bad(format!(
                "item {}: `reward` is not finite",
                self.uid
            )));
        }
        let extra_text = match self.extra_info.map(str::trim) {
            None | Some("null") => "{}",
            Some(raw) if raw.starts_with('{') => raw,
            Some(raw) => {
                return Err(ApiError::bad(format!(
                    "item {}: `extra_info` must be an object, not {raw}",
                    self.uid
                )))
            }
        };
        for (key, text) in [("messages", self.messages), ("extra_info", extra_text)] {
            let depth = nesting(text);
            if depth > MAX_NESTING {
                return Err(ApiError::bad(format!(
                    "item {}: `{key}` nests arrays and objects {depth} deep; at most \
                     {MAX_NESTING}",
                    self.uid
                )));
            }
        }
        let extra: Extra = serde_json::from_str(extra_text).map_err(|e| {
            ApiError::bad(format!(
                "item {}: `extra_info` is not a JSON object: {e}",
                self.uid
            ))
        })?;
        // A whole number the buffer's versions hold (0 to i64::MAX; a string of digits
        // too), so a bad one is this item's 400 and never a failure after others are added.
        let version = match &extra.policy_version {
            None | Some(Value::Null) => 0,
            Some(v) => match v {
                Value::Number(n) => n.as_u64(),
                Value::String(s) => s.trim().parse::<u64>().ok(),
                _ => None,
            }
            .filter(|&v| i64::try_from(v).is_ok())
            .ok_or_else(|| {
                ApiError::bad(format!(
                    "item {}: `extra_info.policy_version` must be a whole number from 0 to {}, not {v}",
                    self.uid,
                    i64::MAX
                ))
            })?,
        };
        let mut r = RolloutRecord::new(environment, self.instance_id, version, self.uid);
        r.reward = Some(self.reward);
        // slime sends `str(time.time())`; anything else that is no finite number (a
        // "NaN", "inf") is the arrival time instead.
        r.created_ts = match &extra.timestamp {
            Some(Value::String(s)) => s.trim().parse().ok(),
            Some(Value::Number(n)) => n.as_f64(),
            _ => None,
        }
        .filter(|t: &f64| t.is_finite())
        .unwrap_or_else(now);
        r.metadata
            .insert("messages".into(), MetaValue::Str(self.messages.to_owned()));
        r.metadata
            .insert("extra_info".into(), MetaValue::Str(extra_text.to_owned()));
        Ok(r)
    }
}

fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// The largest group size (`--group-size`, `num_repeat_per_sample`): slime's are 4 to 64.
pub const MAX_GROUP_SIZE: usize = 1 << 16;

/// `t` seconds as a group timeout: `None` unless it is finite and at least a nanosecond
/// (1e-320 is > 0, and was a zero timeout: every group sealed, or was dropped, at once).
pub fn timeout_seconds(t: f64) -> Option<Duration> {
    Duration::try_from_secs_f64(t).ok().filter(|d| !d.is_zero())
}

/// slime's group settings (`/start_rollout`'s optional fields).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Settings {
    /// `num_repeat_per_sample`: the group size.
    pub group_size: usize,
    /// A group is finished (and may be valid) with this share of the group size.
    pub min_valid_group_size_ratio: f64,
    /// Items that must survive the filter, as a share of the group size.
    pub min_valid_item_size_ratio: f64,
    /// A group with no new item for this long seals...
    pub group_timeout_seconds: f64,
    /// ...if it holds at least this share of the group size.
    pub min_timeout_group_size_ratio: f64,
}

impl Settings {
    /// slime's defaults for a group size.
    pub fn new(group_size: usize) -> Self {
        Self {
            group_size,
            min_valid_group_size_ratio: 1.0,
            min_valid_item_size_ratio: 0.7,
            group_timeout_seconds: 300.0,
            min_timeout_group_size_ratio: 0.7,
        }
    }

    /// slime's `int(group_size * ratio)` (at least 1).
    fn floor_share(&self, ratio: f64) -> usize {
        ((self.group_size as f64) * ratio).floor().max(1.0) as usize
    }

    /// Applies `/start_rollout`'s fields that are present (numbers or numeric strings, as
    /// slime sends them); a present but unreadable one is a 400 naming it.
    pub fn apply(&mut self, payload: &Map<String, Value>) -> Result<(), ApiError> {
        let num = |key: &str| -> Result<Option<f64>, ApiError> {
            match payload.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::Number(n)) => Ok(n.as_f64()),
                Some(Value::String(s)) => s
                    .trim()
                    .parse()
                    .map(Some)
                    .map_err(|_| ApiError::bad(format!("`{key}` must be a number, not {s:?}"))),
                Some(other) => Err(ApiError::bad(format!(
                    "`{key}` must be a number, not {other}"
                ))),
            }
        };
        let mut next = *self;
        if let Some(g) = num("num_repeat_per_sample")? {
            // Bounded: 1e308 saturated to usize::MAX, a size no group ever reaches.
            if g < 1.0 || g.fract() != 0.0 || g > MAX_GROUP_SIZE as f64 {
                return Err(ApiError::bad(format!(
                    "`num_repeat_per_sample` must be a whole number from 1 to {MAX_GROUP_SIZE}, not {g}"
                )));
            }
            next.group_size = g as usize;
        }
        for (key, slot) in [
            (
                "min_valid_group_size_ratio",
                &mut next.min_valid_group_size_ratio,
            ),
            (
                "min_valid_item_size_ratio",
                &mut next.min_valid_item_size_ratio,
            ),
            (
                "min_timeout_group_size_ratio",
                &mut next.min_timeout_group_size_ratio,
            ),
        ] {
            if let Some(v) = num(key)? {
                if !(0.0..=1.0).contains(&v) {
                    return Err(ApiError::bad(format!("`{key}` must be in [0, 1], not {v}")));
                }
                *slot = v;
            }
        }
        if let Some(t) = num("group_timeout_seconds")? {
            if timeout_seconds(t).is_none() {
                return Err(ApiError::bad(format!(
                    "`group_timeout_seconds` must be at least a nanosecond and finite (at most \
                     {:e} s), not {t}",
                    Duration::MAX.as_secs_f64()
                )));
            }
            next.group_timeout_seconds = t;
        }
        *self = next;
        Ok(())
    }

    /// The ingest's grouping. A group seals once it is finished in slime's sense: at
    /// `min_valid_group_size_ratio` of the group size (all of it by default). slime
    /// decides that when a read comes; here the group seals when it gets there. A group
    /// with no item for `group_timeout_seconds` seals if it holds at least
    /// `min_timeout_group_size_ratio` of the group size (slime's `len / size >= ratio`).
    pub fn group_config(&self) -> GroupConfig {
        let timeout_min = ((self.group_size as f64) * self.min_timeout_group_size_ratio)
            .ceil()
            .max(1.0) as usize;
        let target = self.floor_share(self.min_valid_group_size_ratio);
        GroupConfig::new(target).seal_after(
            // Checked when set; a value out of range waits for ever.
            Duration::try_from_secs_f64(self.group_timeout_seconds).unwrap_or(Duration::MAX),
            timeout_min.min(target),
        )
    }

    /// The hooks reads run.
    pub fn hooks(&self) -> SlimeRatios {
        SlimeRatios {
            group_size: self.group_size,
            min_valid: self.floor_share(self.min_valid_group_size_ratio),
            min_items: self.floor_share(self.min_valid_item_size_ratio),
        }
    }
}

/// slime's default hooks with its ratios.
#[derive(Debug, Clone, Copy)]
pub struct SlimeRatios {
    group_size: usize,
    min_valid: usize,
    min_items: usize,
}

impl GroupHooks for SlimeRatios {
    fn group_size(&self) -> usize {
        self.group_size
    }

    /// Every stored group is finished (it sealed). One that sealed finished (at least
    /// `min_valid` items) is valid when its rewards differ; one sealed short by its
    /// timeout skips that rule, as slime's timeout path does.
    fn is_valid_group(&self, group: &TrainGroup) -> Validity {
        let first = group.items.first().map(|i| i.raw_reward);
        let varied = group.items.iter().any(|i| Some(i.raw_reward) != first);
        Validity {
            valid: group.items.len() < self.min_valid || varied,
            finished: true,
        }
    }

    fn min_items(&self) -> usize {
        self.min_items
    }
}

/// What a read took: the answer's items and meta info, and the leases to commit (or to
/// drop, which gives the groups back).
#[derive(Debug)]
pub struct Taken {
    /// The processed items, padded, encoded (none when the read fell short).
    pub items: Items,
    /// How many items `items` holds.
    pub count: usize,
    /// slime's meta info over every group taken, with `finished_groups`.
    pub meta_info: Map<String, Value>,
    /// Leases of the groups answered (committed once the answer is ready).
    pub answered: Vec<Batch>,
    /// Leases of the groups held back because the read fell short (dropped: given back).
    pub held_back: Vec<Batch>,
}

/// The texts of a leased group's items, borrowed from its lease.
struct GroupTexts<'a> {
    instance_id: &'a str,
    messages: Vec<&'a str>,
    extra_info: Vec<&'a str>,
}

impl<'a> GroupTexts<'a> {
    fn of(lease: &'a Batch) -> Self {
        let view = lease.samples().next();
        let texts = |key: &str| -> Vec<&'a str> {
            view.and_then(|v| v.get(key))
                .and_then(|t| t.array::<String>())
                .map(|a| a.into_iter().map(String::as_str).collect())
                .unwrap_or_default()
        };
        Self {
            instance_id: match view.and_then(|v| v.get_meta("example_id")) {
                Some(MetaValue::Str(s)) => s.as_str(),
                _ => "",
            },
            messages: texts("meta/messages"),
            extra_info: texts("meta/extra_info"),
        }
    }
}

/// Leases every ready group (or until `batch_size` items, when positive), runs the
/// hooks, encodes the items as `format` asks, and splits the leases: `answered` when the
/// items reach `batch_size` (or any, with `batch_size <= 0`), else `held_back`. Groups
/// the hooks reject are archived here.
pub async fn take(
    buf: &SequenceBuffer,
    settings: &Settings,
    batch_size: i64,
    format: Format,
) -> Result<Taken, ApiError> {
    let hooks = settings.hooks();
    let mut leases = Vec::new();
    let mut groups = Vec::new();
    let mut valid_items = 0usize;
    while batch_size <= 0 || valid_items < batch_size as usize {
        let batch = match buf
            .get_batch_for_rpc_timeout(TRAIN_RPC, Duration::ZERO)
            .await
        {
            Ok(b) => b,
            Err(rollout_buffer::Error::Timeout { .. }) => break,
            Err(e) => return Err(e.into()),
        };
        let Some(view) = batch.samples().next() else {
            continue;
        };
        let group = TrainGroup::read(view.id().as_str(), |k| view.get(k), |k| view.get_meta(k))?;
        // What the hooks keep: a group they reject (its rewards out of range, say)
        // counts nothing, and the read goes on to the next.
        valid_items += items_kept(&hooks, &group);
        groups.push(group);
        leases.push(batch);
    }
    // Each item's texts, found by uid (padding repeats items), borrowed from the leases.
    let texts: Vec<GroupTexts<'_>> = leases.iter().map(GroupTexts::of).collect();
    // By group, then uid: two groups may hold the same uid (nothing makes a generator's
    // uids unique across groups), and each item must keep its own group's texts.
    let mut by_group: HashMap<String, (usize, HashMap<String, usize>)> = HashMap::new();
    for (g, group) in groups.iter().enumerate() {
        let uids = group
            .items
            .iter()
            .enumerate()
            .map(|(i, item)| (item.rollout_uid.clone(), i))
            .collect();
        by_group.insert(group.id.clone(), (g, uids));
    }
    let mut meta_info = meta_info(&groups);
    let finished: Vec<&str> = texts.iter().map(|t| t.instance_id).collect();
    meta_info.insert("finished_groups".into(), json!(finished));
    let processed = process_groups(&hooks, &Advantage::None, None, groups);
    let rejected: HashSet<&str> = processed
        .rejected
        .iter()
        .map(|(g, _)| g.id.as_str())
        .collect();
    let mut items = Vec::new();
    for (group, item) in processed
        .kept
        .iter()
        .flat_map(|g| g.items.iter().map(move |i| (g, i)))
    {
        let Some((g, i)) = by_group
            .get(&group.id)
            .and_then(|(g, uids)| Some((*g, *uids.get(&item.rollout_uid)?)))
        else {
            continue;
        };
        let group = &texts[g];
        items.push(OutItem {
            uid: &item.rollout_uid,
            instance_id: group.instance_id,
            messages: group.messages.get(i).copied(),
            reward: item.reward,
            raw_reward: item.raw_reward,
            extra_info: group.extra_info.get(i).copied(),
        });
    }
    let enough = batch_size <= 0 || items.len() >= batch_size as usize;
    let (items, count) = if enough {
        (Items::encode(format, &items)?, items.len())
    } else {
        (Items::empty(format)?, 0)
    };
    let is_rejected: Vec<bool> = leases
        .iter()
        .map(|lease| {
            lease
                .samples()
                .next()
                .is_some_and(|v| rejected.contains(v.id().as_str()))
        })
        .collect();
    drop(texts);
    let mut out = Taken {
        items,
        count,
        meta_info,
        answered: Vec::new(),
        held_back: Vec::new(),
    };
    for (lease, is_rejected) in leases.into_iter().zip(is_rejected) {
        if is_rejected {
            lease.discard_with_reason("invalid_group")?;
        } else if enough {
            out.answered.push(lease);
        } else {
            out.held_back.push(lease);
        }
    }
    Ok(out)
}

/// slime's `get_group_data_meta_info` over the groups taken (raw rewards; sample std).
fn meta_info(groups: &[TrainGroup]) -> Map<String, Value> {
    let rewards: Vec<f64> = groups
        .iter()
        .flat_map(|g| g.items.iter().map(|i| i.raw_reward))
        .collect();
    let n = rewards.len();
    let mut m = Map::new();
    if n == 0 {
        for k in [
            "total_samples",
            "num_groups",
            "avg_group_size",
            "avg_reward",
            "reward_std",
            "reward_min",
            "reward_max",
        ] {
            m.insert(k.into(), json!(0));
        }
        return m;
    }
    let (mean, std) = mean_and_std(&rewards);
    m.insert("total_samples".into(), json!(n));
    m.insert("num_groups".into(), json!(groups.len()));
    m.insert(
        "avg_group_size".into(),
        json!(n as f64 / groups.len() as f64),
    );
    m.insert("avg_reward".into(), json!(mean));
    m.insert("reward_std".into(), json!(std));
    m.insert(
        "reward_min".into(),
        json!(rewards.iter().copied().fold(f64::INFINITY, f64::min)),
    );
    m.insert(
        "reward_max".into(),
        json!(rewards.iter().copied().fold(f64::NEG_INFINITY, f64::max)),
    );
    m
}

/// The mean and sample standard deviation of `values` (finite, at least one), scaled by
/// the largest magnitude so values near f64's range do not overflow the sums: the mean of
/// two rewards of 1e308 was infinite, answered as null. Only a spread itself past f64's
/// range still is.
fn mean_and_std(values: &[f64]) -> (f64, f64) {
    let n = values.len();
    let scale = values.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    if n == 0 || scale == 0.0 {
        return (0.0, 0.0);
    }
    let mean = values.iter().map(|v| v / scale).sum::<f64>() / n as f64;
    let squares = values
        .iter()
        .map(|v| (v / scale - mean).powi(2))
        .sum::<f64>();
    let std = if n > 1 {
        (squares / (n - 1) as f64).sqrt()
    } else {
        0.0
    };
    (mean * scale, std * scale)
}

#[cfg(test)]
mod tests {
    // `expect` and `unwrap` in this test code are its assertions, or fixtures that cannot
    // fail (an in-memory store, a runtime, data the test built); library code has none
    // (tests/layout.rs checks).
    use super::{Item, ItemText};

    #[test]
    fn an_instance_id_is_a_string_or_an_integer_of_64_bits() {
        let id = |json: &str| {
            let text =
                format!(r#"{{"uid": "u", "instance_id": {json}, "messages": [], "reward": 1}}"#);
            let item: Item<'_> = serde_json::from_str(&text).expect("an item");
            item.into_record("env").map(|r| r.example_id)
        };
        assert_eq!(id(r#""q7""#).expect("a string"), "q7");
        assert_eq!(id("7").expect("an integer"), "7");
        assert_eq!(id("-7").expect("a negative integer"), "-7");
        assert_eq!(
            id("18446744073709551615").expect("u64::MAX"),
            "18446744073709551615"
        );
        for float in ["123456789012345678901", "1e2", "7.5", "-0.0"] {
            let err = id(float).expect_err(float).to_string();
            assert!(err.contains("not an integer of 64 bits"), "{float}: {err}");
        }
    }

    fn created_ts(extra: &str) -> f64 {
        let item = ItemText {
            uid: "u".into(),
            instance_id: "q".into(),
            messages: "[]",
            reward: 1.0,
            extra_info: Some(extra),
        };
        item.into_record("env").expect("a valid item").created_ts
    }

    #[test]
    fn a_timestamp_that_is_no_finite_number_is_the_arrival_time() {
        assert_eq!(
            created_ts(r#"{"timestamp": "1700000000.5"}"#),
            1_700_000_000.5
        );
        assert_eq!(created_ts(r#"{"timestamp": 12.0}"#), 12.0);
        let before = super::now();
        for odd in [
            r#""NaN""#,
            r#""inf""#,
            r#""-inf""#,
            r#""soon""#,
            "null",
            "[1]",
        ] {
            let t = created_ts(&format!(r#"{{"timestamp": {odd}}}"#));
            assert!(t.is_finite() && t >= before, "{odd}: {t}");
        }
    }

    #[test]
    fn reward_statistics_hold_near_the_range_of_f64() {
        use super::mean_and_std;
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-12 * b.abs().max(1.0);
        let (mean, std) = mean_and_std(&[0.0, 1.0, 0.0, 1.0]);
        assert!(
            close(mean, 0.5) && close(std, (1.0f64 / 3.0).sqrt()),
            "{mean} {std}"
        );
        assert_eq!(mean_and_std(&[0.0, 0.0]), (0.0, 0.0));
        assert_eq!(mean_and_std(&[-2.5]), (-2.5, 0.0));
        let (mean, std) = mean_and_std(&[1e308, 1e308, 1e308]);
        assert!(close(mean, 1e308) && std == 0.0, "{mean} {std}");
        let (mean, std) = mean_and_std(&[1.7e308, -1.7e308]);
        assert!(
            mean == 0.0 && std.is_infinite(),
            "a spread past f64: {mean} {std}"
        );
    }
}
