//! `Packer`: groups into a [`TrainBatch`] of `[B, S]` ndarray tensors, several sequences
//! per row.
//!
//! A sequence is one rollout's prompt followed by its output. Groups are packed whole
//! (a group's advantages are relative to each other, and its lease is finished as one):
//! groups by total tokens, largest first, and within a group its sequences largest first,
//! each into the first row with room (first-fit decreasing); a group that does not fit
//! entirely is left for the next batch. A sequence longer than `S` is truncated to its
//! first `S` tokens or rejected, by [`Overlong`]; it is never split across rows.
//!
//! Per position: `input_ids` (`pad_id` in padding), `position_ids` (from 0 in each
//! sequence), `segment_ids` (1, 2, ... per sequence in the row, 0 = padding), `loss_mask`
//! (output tokens only), `advantages` (the rollout's advantage on its output tokens),
//! `behavior_logprobs`, `ref_logprobs` (when every packed rollout has them),
//! `policy_versions` (per output token, -1 elsewhere). `rows` maps every segment back to
//! its group and rollout.

use super::train_group::{TrainGroup, TrainItem};
use crate::error::{Error, Result};
use ndarray::Array2;

/// How many rows a batch has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Rows {
    /// Exactly `B` rows (padding rows when the groups do not fill them).
    Fixed(usize),
    /// As many rows as the packed groups need, with at most this many real tokens.
    TokenBudget(usize),
}

/// What happens to a sequence longer than the row length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Overlong {
    /// Keep its first `S` tokens (the prompt first).
    #[default]
    Truncate,
    /// Leave its group out of the batch, reported in [`Packed::rejected`].
    Reject,
}

/// Packs groups into fixed-shape batches (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packer {
    /// Tokens per row (`S`).
    pub seq_len: usize,
    /// Rows per batch.
    pub rows: Rows,
    /// The token id of padding.
    pub pad_id: i32,
    /// When set (and not 0, which counts as unset), the row length is the longest row
    /// rounded up to a multiple of this (at most `seq_len`) instead of `seq_len`.
    pub pad_to_multiple: Option<usize>,
    /// What a sequence longer than `seq_len` does.
    pub overlong: Overlong,
}

/// Where one sequence sits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    /// The group's id.
    pub group_id: String,
    /// The rollout's uid.
    pub rollout_uid: String,
    /// Its index in the group's items (padding copies included).
    pub item: usize,
    /// First column.
    pub start: usize,
    /// Tokens (after truncation).
    pub len: usize,
    /// Whether it was truncated.
    pub truncated: bool,
}

/// A packed batch of `[B, S]` tensors.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainBatch {
    /// Token ids.
    pub input_ids: Array2<i32>,
    /// Position within each sequence.
    pub position_ids: Array2<i32>,
    /// 1, 2, ... per sequence in a row; 0 for padding.
    pub segment_ids: Array2<i32>,
    /// True on output (response) tokens.
    pub loss_mask: Array2<bool>,
    /// The rollout's advantage on its output tokens, 0 elsewhere.
    pub advantages: Array2<f32>,
    /// Behaviour-policy logprobs on output tokens, 0 elsewhere.
    pub behavior_logprobs: Array2<f32>,
    /// Reference logprobs on output tokens, when every packed rollout has them.
    pub ref_logprobs: Option<Array2<f32>>,
    /// Policy version per output token; -1 elsewhere and past an item's `token_versions`.
    pub policy_versions: Array2<i64>,
    /// Per row, its sequences.
    pub rows: Vec<Vec<Segment>>,
    /// Ids of the groups packed, in packing order.
    pub group_ids: Vec<String>,
    /// Real (non-padding) tokens.
    pub real_tokens: usize,
}

impl TrainBatch {
    /// Real tokens / (B * S).
    pub fn efficiency(&self) -> f64 {
        let cells = self.input_ids.len();
        if cells == 0 {
            0.0
        } else {
            self.real_tokens as f64 / cells as f64
        }
    }
}

/// A packing: the batch, and the groups left out.
#[derive(Debug, Clone, PartialEq)]
pub struct Packed {
    /// The batch.
    pub batch: TrainBatch,
    /// Indexes (into the input) of groups that did not fit: for the next batch.
    pub leftover: Vec<usize>,
    /// Indexes of groups with a sequence over `seq_len` under [`Overlong::Reject`].
    pub rejected: Vec<usize>,
}

impl Packer {
    /// `B` rows of `seq_len` tokens, pad id 0, truncating overlong sequences.
    pub fn new(seq_len: usize, rows: usize) -> Self {
        Self {
            seq_len,
            rows: Rows::Fixed(rows),
            pad_id: 0,
            pad_to_multiple: None,
            overlong: Overlong::Truncate,
        }
    }

    /// The most rows a batch has, and the most real tokens it holds.
    fn limits(&self) -> (usize, usize) {
        match self.rows {
            Rows::Fixed(b) => (b, usize::MAX),
            Rows::TokenBudget(t) => (usize::MAX, t),
        }
    }

    /// Whether [`Self::pack`] would pack `group` into a batch holding nothing else. A
    /// group for which it would not fits no batch of this packer: given back, it would
    /// be leased again at every batch and left over again.
    pub(crate) fn fits_alone(&self, group: &TrainGroup) -> bool {
        let s = self.seq_len;
        let (max_rows, budget) = self.limits();
        if s == 0 || (self.overlong == Overlong::Reject && group.items.iter().any(|i| i.len() > s))
        {
            return false;
        }
        let tokens: usize = group.items.iter().map(|i| i.len().min(s)).sum();
        tokens <= budget && place_group(group, 0, s, max_rows, &mut Vec::new(), &mut Vec::new())
    }

    /// Packs `groups` (see the module docs).
    ///
    /// # Errors
    ///
    /// Only [`Error::InvalidPacking`], for a `seq_len` of 0 or a fixed row count of 0, or
    /// a batch of more rows and tokens than the process can allocate.
    pub fn pack(&self, groups: &[TrainGroup]) -> Result<Packed> {
        let s = self.seq_len;
        let bad = |detail: &str| Error::InvalidPacking {
            detail: detail.to_owned(),
        };
        if s == 0 {
            return Err(bad("seq_len is 0"));
        }
        if self.rows == Rows::Fixed(0) {
            return Err(bad("0 rows"));
        }
        let (max_rows, budget) = self.limits();
        let clipped = |item: &TrainItem| item.len().min(s);
        let mut order: Vec<usize> = (0..groups.len()).collect();
        let group_tokens = |g: &TrainGroup| g.items.iter().map(clipped).sum::<usize>();
        order.sort_by_key(|&g| std::cmp::Reverse(group_tokens(&groups[g])));
        let mut fill: Vec<usize> = Vec::new(); // tokens used per row
        let mut placed: Vec<(usize, usize, usize, usize)> = Vec::new(); // (group, item, row, start)
        let mut leftover = Vec::new();
        let mut rejected = Vec::new();
        let mut real = 0usize;
        let mut packed_groups = Vec::new();
        for &g in &order {
            let group = &groups[g];
            if self.overlong == Overlong::Reject && group.items.iter().any(|i| i.len() > s) {
                rejected.push(g);
                continue;
            }
            let tokens = group_tokens(group);
            if real + tokens > budget {
                leftover.push(g);
                continue;
            }
            if place_group(group, g, s, max_rows, &mut fill, &mut placed) {
                real += tokens;
                packed_groups.push(g);
            } else {
                leftover.push(g);
            }
        }
        let b = match self.rows {
            Rows::Fixed(b) => b,
            Rows::TokenBudget(_) => fill.len(),
        };
        let width = match self.pad_to_multiple {
            Some(m) if m > 0 => {
                let longest = fill.iter().copied().max().unwrap_or(0).max(1);
                longest.div_ceil(m).saturating_mul(m).min(s)
            }
            _ => s,
        };
        // Eight arrays of b x width cells (at most 40 bytes a cell in all): settings the
        // process cannot hold are an error here, not a panic or an abort building them.
        let bytes = b.checked_mul(width).and_then(|cells| cells.checked_mul(40));
        if bytes.is_none_or(|n| Vec::<u8>::new().try_reserve_exact(n).is_err()) {
            return Err(Error::InvalidPacking {
                detail: format!(
                    "a batch of {b} rows of {width} tokens needs more memory than this \
                     process can allocate"
                ),
            });
        }
        let with_refs = !placed.is_empty()
            && placed
                .iter()
                .all(|&(g, i, _, _)| groups[g].items[i].ref_logprobs.is_some());
        let mut batch = TrainBatch {
            input_ids: Array2::from_elem((b, width), self.pad_id),
            position_ids: Array2::zeros((b, width)),
            segment_ids: Array2::zeros((b, width)),
            loss_mask: Array2::from_elem((b, width), false),
            advantages: Array2::zeros((b, width)),
            behavior_logprobs: Array2::zeros((b, width)),
            ref_logprobs: with_refs.then(|| Array2::zeros((b, width))),
            policy_versions: Array2::from_elem((b, width), -1),
            rows: vec![Vec::new(); b],
            group_ids: packed_groups
                .iter()
                .map(|&g| groups[g].id.clone())
                .collect(),
            real_tokens: real,
        };
        for &(g, i, row, start) in &placed {
            write_sequence(&mut batch, &groups[g], i, row, start, s);
        }
        leftover.sort_unstable();
        rejected.sort_unstable();
        Ok(Packed {
            batch,
            leftover,
            rejected,
        })
    }
}

/// Places `group` (input index `g`) into the rows `fill` (tokens used per row): its
/// sequences largest first, each into the first row with room, a row opened while fewer
/// than `max_rows` exist. Either the whole group is placed, its sequences appended to
/// `placed` as `(group, item, row, start)`, or nothing is and `false` comes back with
/// `fill` and `placed` as they were.
fn place_group(
    group: &TrainGroup,
    g: usize,
    s: usize,
    max_rows: usize,
    fill: &mut Vec<usize>,
    placed: &mut Vec<(usize, usize, usize, usize)>,
) -> bool {
    let clipped = |item: &TrainItem| item.len().min(s);
    let mut items: Vec<usize> = (0..group.items.len()).collect();
    items.sort_by_key(|&i| std::cmp::Reverse(clipped(&group.items[i])));
    let (rows_before, placed_before) = (fill.len(), placed.len());
    for &i in &items {
        let len = clipped(&group.items[i]);
        match fill.iter().position(|&used| used + len <= s) {
            Some(row) => {
                placed.push((g, i, row, fill[row]));
                fill[row] += len;
            }
            None if fill.len() < max_rows => {
                placed.push((g, i, fill.len(), 0));
                fill.push(len);
            }
            None => {
                // Undo: the rows opened go, the rows that were there give back what
                // this group's sequences took of them.
                for &(_, i, row, _) in &placed[placed_before..] {
                    if row < rows_before {
                        fill[row] -= clipped(&group.items[i]);
                    }
                }
                fill.truncate(rows_before);
                placed.truncate(placed_before);
                return false;
            }
        }
    }
    true
}

/// Writes item `i` of `group` into `row` from column `start`, truncated to `s` tokens.
fn write_sequence(
    batch: &mut TrainBatch,
    group: &TrainGroup,
    i: usize,
    row: usize,
    start: usize,
    s: usize,
) {
    let item = &group.items[i];
    let len = item.len().min(s);
    let prompt = item.prompt_tokens.len();
    let segment = batch.rows[row].len() as i32 + 1;
    for p in 0..len {
        let col = start + p;
        let (token, output) = if p < prompt {
            (item.prompt_tokens[p], None)
        } else {
            (item.output_tokens[p - prompt], Some(p - prompt))
        };
        batch.input_ids[[row, col]] = token;
        batch.position_ids[[row, col]] = p as i32;
        batch.segment_ids[[row, col]] = segment;
        if let Some(o) = output {
            batch.loss_mask[[row, col]] = true;
            batch.advantages[[row, col]] = item.advantage as f32;
            batch.behavior_logprobs[[row, col]] = item.logprobs.get(o).copied().unwrap_or(0.0);
            batch.policy_versions[[row, col]] = item.token_versions.get(o).copied().unwrap_or(-1);
            if let (Some(refs), Some(item_refs)) = (batch.ref_logprobs.as_mut(), &item.ref_logprobs)
            {
                refs[[row, col]] = item_refs.get(o).copied().unwrap_or(0.0);
            }
        }
    }
    batch.rows[row].push(Segment {
        group_id: group.id.clone(),
        rollout_uid: item.rollout_uid.clone(),
        item: i,
        start,
        len,
        truncated: len < item.len(),
    });
}
