//! `TrainGroup`: a sealed group read back from the buffer in the form trainers work on:
//! one [`TrainItem`] per rollout, with its tokens, logprobs, raw and working reward and
//! advantage. Group hooks filter, normalise and pad these; the packer packs them.

use crate::error::{Error, Result};
use crate::sample::{MetaValue, Sample};
use crate::tensor::Tensor;

/// The keys a trainer RPC reading groups needs as inputs (the batch carries only those).
/// Add `ref_logprobs` when every group has it.
pub const GROUP_INPUTS: [&str; 7] = [
    "prompt_tokens",
    "output_tokens",
    "logprobs",
    "token_versions",
    "reward",
    "rollout_uid",
    "truncated",
];

/// The RPC a [`Batcher`](super::Batcher) source reads groups through: one group per lease,
/// the inputs a [`TrainGroup`] needs, newest group first (the default order of trainer
/// batches; set another selection on the result to change it).
pub fn trainer_rpc(name: &str) -> crate::RpcDef {
    crate::RpcDef::new(name, 1)
        .inputs(GROUP_INPUTS)
        .selection(crate::Selection::Lifo)
}

/// One rollout of a group, as trained on.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainItem {
    /// The rollout's uid.
    pub rollout_uid: String,
    /// The prompt.
    pub prompt_tokens: Vec<i32>,
    /// The generated tokens.
    pub output_tokens: Vec<i32>,
    /// Behaviour-policy logprobs, one per output token.
    pub logprobs: Vec<f32>,
    /// Reference logprobs, one per output token, when the group has them.
    pub ref_logprobs: Option<Vec<f32>>,
    /// Policy version per output token.
    pub token_versions: Vec<i64>,
    /// The reward as stored.
    pub raw_reward: f64,
    /// The reward after normalisation and padding (starts equal to `raw_reward`).
    pub reward: f64,
    /// The advantage (set when the group is processed).
    pub advantage: f64,
    /// Whether generation hit the length limit.
    pub truncated: bool,
    /// For a padding copy: the index of the item it copies.
    pub copy_of: Option<usize>,
}

impl TrainItem {
    /// Prompt plus output tokens.
    pub fn len(&self) -> usize {
        self.prompt_tokens.len() + self.output_tokens.len()
    }

    /// True for an item with no tokens.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A group as trained on.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainGroup {
    /// The group id (the buffer sample's id).
    pub id: String,
    /// The environment.
    pub environment: String,
    /// The oldest member's policy version.
    pub policy_version: u64,
    /// The members, in the group's order (sorted by uid), then padding copies.
    pub items: Vec<TrainItem>,
}

impl TrainGroup {
    /// Reads a group sample's fields (`get`) and metadata (`meta`); `id` names it in
    /// errors.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidRollout`] (with `id` as its uid) when a field of the group layout is
    /// missing or of another type, a member lacks one of its sequences or its reward, or a
    /// member's logprobs and output tokens differ in length.
    pub fn read<'a>(
        id: &str,
        get: impl Fn(&str) -> Option<&'a Tensor>,
        meta: impl Fn(&str) -> Option<&'a MetaValue>,
    ) -> Result<Self> {
        let bad = |detail: String| Error::InvalidRollout {
            uid: id.to_owned(),
            detail,
        };
        let field = |key: &str| get(key).ok_or_else(|| bad(format!("no `{key}` field")));
        let seq_i32 = |t: &Tensor, i: usize| {
            t.sequence::<i32>(i)
                .map(|a| a.iter().copied().collect::<Vec<_>>())
        };
        let seq_f32 = |t: &Tensor, i: usize| {
            t.sequence::<f32>(i)
                .map(|a| a.iter().copied().collect::<Vec<_>>())
        };
        let prompts = field("prompt_tokens")?;
        let outputs = field("output_tokens")?;
        let logprobs = field("logprobs")?;
        let versions = field("token_versions")?;
        let rewards = field("reward")?
            .array::<f64>()
            .ok_or_else(|| bad("`reward` is not float64".into()))?;
        let uids = field("rollout_uid")?
            .array::<String>()
            .ok_or_else(|| bad("`rollout_uid` is not strings".into()))?;
        let truncated = field("truncated")?
            .array::<bool>()
            .ok_or_else(|| bad("`truncated` is not booleans".into()))?;
        let refs = get("ref_logprobs");
        let k = uids.len();
        let mut items = Vec::with_capacity(k);
        for i in 0..k {
            let missing = |what: &str| bad(format!("rollout {i}: no {what}"));
            let output_tokens = seq_i32(outputs, i).ok_or_else(|| missing("output tokens"))?;
            let item = TrainItem {
                rollout_uid: uids.iter().nth(i).cloned().unwrap_or_default(),
                prompt_tokens: seq_i32(prompts, i).ok_or_else(|| missing("prompt tokens"))?,
                logprobs: seq_f32(logprobs, i).ok_or_else(|| missing("logprobs"))?,
                ref_logprobs: refs.and_then(|t| seq_f32(t, i)),
                token_versions: versions
                    .sequence::<i64>(i)
                    .map(|a| a.iter().copied().collect())
                    .ok_or_else(|| missing("token versions"))?,
                raw_reward: rewards
                    .iter()
                    .nth(i)
                    .copied()
                    .ok_or_else(|| missing("reward"))?,
                reward: 0.0,
                advantage: 0.0,
                truncated: truncated.iter().nth(i).copied().unwrap_or(false),
                copy_of: None,
                output_tokens,
            };
            if item.logprobs.len() != item.output_tokens.len() {
                return Err(bad(format!(
                    "rollout {i}: logprobs and output tokens differ in length"
                )));
            }
            items.push(TrainItem {
                reward: item.raw_reward,
                ..item
            });
        }
        let environment = match meta("environment") {
            Some(MetaValue::Str(e)) => e.clone(),
            _ => String::new(),
        };
        let policy_version = match meta(crate::buffer::POLICY_VERSION) {
            Some(MetaValue::Int(v)) => u64::try_from(*v).unwrap_or(0),
            _ => 0,
        };
        Ok(Self {
            id: id.to_owned(),
            environment,
            policy_version,
            items,
        })
    }

    /// Reads a stored group sample.
    ///
    /// # Errors
    ///
    /// As [`Self::read`]: [`Error::InvalidRollout`] for a sample that does not hold a
    /// well-formed group.
    pub fn from_sample(sample: &Sample) -> Result<Self> {
        Self::read(
            sample.id().as_str(),
            |k| sample.get(k),
            |k| sample.get_meta(k),
        )
    }

    /// The members that are not padding copies.
    pub fn originals(&self) -> impl Iterator<Item = &TrainItem> {
        self.items.iter().filter(|i| i.copy_of.is_none())
    }

    /// Tokens in all items.
    pub fn tokens(&self) -> usize {
        self.items.iter().map(TrainItem::len).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rollout::{GroupKey, GroupMode, RolloutRecord, SealReason, SealedGroup};

    #[test]
    fn a_sealed_group_reads_back_item_by_item() -> Result<()> {
        let records: Vec<RolloutRecord> = (0..3)
            .map(|k| {
                let mut r = RolloutRecord::new("code", "ex", 4, format!("u{k}"));
                r.prompt_tokens = vec![1, 2];
                r.output_tokens = vec![10 + k; k as usize + 1];
                r.logprobs = vec![-0.5; k as usize + 1];
                r.reward = Some(f64::from(k));
                r.truncated = k == 2;
                r
            })
            .collect();
        let key = GroupKey::of(&records[0], GroupMode::Strict);
        let sealed = SealedGroup::new(key, records.clone(), SealReason::Full);
        let g = TrainGroup::from_sample(&sealed.to_sample()?)?;
        assert_eq!(
            (g.id.as_str(), g.environment.as_str(), g.policy_version),
            (sealed.id.as_str(), "code", 4)
        );
        assert_eq!(g.items.len(), 3);
        for (item, r) in g.items.iter().zip(&records) {
            assert_eq!(item.rollout_uid, r.rollout_uid);
            assert_eq!(item.output_tokens, r.output_tokens);
            assert_eq!(item.logprobs, r.logprobs);
            assert_eq!(item.token_versions, vec![4; r.output_tokens.len()]);
            assert_eq!(
                (item.raw_reward, item.reward),
                (r.reward.unwrap_or(0.0), r.reward.unwrap_or(0.0))
            );
            assert_eq!(item.truncated, r.truncated);
        }
        assert_eq!(g.tokens(), 2 * 3 + 1 + 2 + 3);
        assert!(g
            .items
            .iter()
            .all(|i| !i.is_empty() && i.len() == 2 + i.output_tokens.len()));
        let mut empty = g.items[0].clone();
        (empty.prompt_tokens, empty.output_tokens) = (Vec::new(), Vec::new());
        assert!(empty.is_empty());
        Ok(())
    }
}
