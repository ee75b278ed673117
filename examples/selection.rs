//! What one batch of randomised selection costs as the pool grows: `Uniform`, `Recency`
//! and `Prioritized` at 1K, 65K and 1M eligible samples.
//!
//! Each case fills a buffer with `eligible` small samples (a token and a priority), then
//! leases batches of 64 through the public API and gives each back (dropping the batch),
//! so the pool stays the same size; the figure is the mean time of one lease plus its
//! release, the median over `--rounds` rounds (5) of `--batches` batches (2,000), after a
//! warm-up round. The sizes of one policy are timed in turn, round after round (see
//! [`interleaved`]), and `vs_smallest` is the median over rounds of a size's time over the
//! first size's time in the same round: the flatness from the first size to this one,
//! with the host's drift between them left out. One JSON line per case:
//!
//! ```text
//! cargo run --release --example selection [-- --sizes 1024,65536,1048576 --batches 2000 --rounds 5
//!     --policies Fifo,Uniform,Recency,Prioritized,memory]
//! {"policy": "Prioritized", "eligible": 1048576, "batch": 64, "us_per_batch": ..., "vs_smallest": ...}
//! ```
//!
//! The `memory` line of each size is what the machine charges, at that size, for what a
//! randomised batch cannot avoid: per sample, [`FLOOR_LINES`] random cache lines of tables
//! of `eligible` lines each (its index entry, its slot's line, its sample's reference and
//! that reference's count), the 64 samples' loads all issued together, as the batch's
//! prefetch passes issue them. On a shared host that cost moves from hour to hour; the line
//! shows how far it moved in the run the policies' figures come from.

use rollout_buffer::{RpcDef, Sample, Selection, SequenceBuffer};
use std::time::Instant;

const BATCH: usize = 64;
/// Samples of the untimed case that warms the process up.
const WARM_UP_SIZE: usize = 1024;
/// Random lines per sample the `memory` line touches.
const FLOOR_LINES: usize = 4;

struct Args {
    sizes: Vec<usize>,
    /// Policy names to run (all when empty).
    policies: Vec<String>,
    batches: usize,
    rounds: usize,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        sizes: vec![1024, 65_536, 1 << 20],
        policies: Vec::new(),
        batches: 2000,
        rounds: 5,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        let number = |v: &str| v.parse::<usize>().map_err(|e| format!("{flag} {v}: {e}"));
        match flag.as_str() {
            "--sizes" => args.sizes = value.split(',').map(number).collect::<Result<_, _>>()?,
            "--policies" => args.policies = value.split(',').map(str::to_owned).collect(),
            "--batches" => args.batches = number(&value)?,
            "--rounds" => args.rounds = number(&value)?.max(1),
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    Ok(args)
}

fn policies() -> Vec<(&'static str, Selection)> {
    vec![
        // The floor: the lease, snapshot and release every policy pays, without a draw.
        ("Fifo", Selection::Fifo),
        ("Uniform", Selection::Uniform { seed: 1 }),
        (
            "Recency",
            Selection::Recency {
                alpha: 1.0,
                seed: 1,
            },
        ),
        (
            "Prioritized",
            Selection::Prioritized {
                key: "priority".into(),
                exponent: 0.6,
                seed: 1,
            },
        ),
    ]
}

async fn filled(selection: Selection, eligible: usize) -> Result<SequenceBuffer, String> {
    let buf = SequenceBuffer::new(
        eligible,
        [RpcDef::new("train", BATCH)
            .inputs(["tokens"])
            .reads(u32::from(u16::MAX))
            .selection(selection)],
    )
    .map_err(|e| e.to_string())?;
    let mut next = 0usize;
    while next < eligible {
        let end = (next + 16_384).min(eligible);
        let samples = (next..end)
            .map(|i| {
                Sample::new(format!("s{i}"))
                    .with("tokens", vec![i as i32])
                    // Priorities spread over four orders of magnitude, as TD errors are.
                    .with("priority", 1e-2 + ((i * 7919) % 10_000) as f64)
            })
            .collect();
        buf.put_batch(samples).await.map_err(|e| e.to_string())?;
        next = end;
    }
    Ok(buf)
}

/// Mean microseconds per lease and release over `batches` batches.
async fn round(buf: &SequenceBuffer, batches: usize) -> Result<f64, String> {
    let start = Instant::now();
    for _ in 0..batches {
        let batch = buf
            .get_batch_for_rpc("train")
            .await
            .map_err(|e| e.to_string())?;
        drop(batch);
    }
    Ok(start.elapsed().as_secs_f64() * 1e6 / batches as f64)
}

/// One cache line of a `memory` table.
#[derive(Clone, Copy)]
#[repr(align(64))]
struct Line([u64; 8]);

/// The `memory` line's tables at one size: [`FLOOR_LINES`] tables of `eligible` lines.
struct Floor {
    tables: Vec<Vec<Line>>,
    eligible: usize,
}

impl Floor {
    fn new(eligible: usize) -> Self {
        let eligible = eligible.max(1);
        let tables = (0..FLOOR_LINES)
            .map(|t| vec![Line([t as u64 + 1; 8]); eligible])
            .collect();
        Self { tables, eligible }
    }

    /// Mean microseconds to load, for each of a batch's samples, one random line of each
    /// table (see the module docs).
    fn round(&self, batches: usize) -> f64 {
        // xorshift64: the draws must cost next to nothing beside the loads.
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let eligible = self.eligible;
        let mut draw = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as usize % eligible
        };
        let mut picks = vec![0usize; BATCH];
        let mut sum = 0u64;
        let start = Instant::now();
        for _ in 0..batches {
            picks.iter_mut().for_each(|p| *p = draw());
            for table in &self.tables {
                for &p in &picks {
                    sum = sum.wrapping_add(table[p].0[0]);
                }
            }
        }
        std::hint::black_box(sum);
        start.elapsed().as_secs_f64() * 1e6 / batches as f64
    }
}

/// One line's cases, one per size, timed round-robin (see [`interleaved`]).
enum Cases {
    Floor(Vec<Floor>),
    Buffers(Vec<SequenceBuffer>),
}

impl Cases {
    async fn round(&self, case: usize, batches: usize) -> Result<f64, String> {
        match self {
            Cases::Floor(floors) => Ok(floors[case].round(batches)),
            Cases::Buffers(bufs) => round(&bufs[case], batches).await,
        }
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Times every size of one line in turn, round after round, so that each round of the
/// largest size runs within seconds of one of the smallest: on a shared host the cost of
/// memory moves by half from minute to minute, and sizes timed one after the other would
/// put that drift into the ratio between them. Each round starts at the next size (so no
/// size always follows the largest) and is preceded by an untimed quarter of a round,
/// which brings the case's tree and block headers back into the caches the other sizes
/// took (with a twentieth, a million samples' headers were half cold when the timing
/// started, and the largest size measured a fifth slower than timed on its own).
///
/// Returns per size the median time and the median, over rounds, of its time over the
/// smallest size's time in the same round.
async fn interleaved(cases: &Cases, n: usize, args: &Args) -> Result<Vec<(f64, f64)>, String> {
    for case in 0..n {
        cases.round(case, args.batches / 4 + 1).await?;
    }
    let mut times = vec![Vec::with_capacity(args.rounds); n];
    for r in 0..args.rounds {
        for i in 0..n {
            let case = (r + i) % n;
            cases.round(case, args.batches / 4 + 1).await?;
            times[case].push(cases.round(case, args.batches).await?);
        }
    }
    Ok((0..n)
        .map(|case| {
            let ratios = (0..args.rounds)
                .map(|r| times[case][r] / times[0][r])
                .collect();
            (median(times[case].clone()), median(ratios))
        })
        .collect())
}

async fn run(args: Args) -> Result<(), String> {
    let wanted = |name: &str| args.policies.is_empty() || args.policies.iter().any(|p| p == name);
    // The first case of a fresh process ran slower than the same case later (Fifo at 1K:
    // 10 against 6 us per batch): the allocator's first pages and the core's clock. One
    // untimed case first, so every figure is taken in a warm process. At 1K whatever the
    // sizes asked for, so it neither takes long nor sets the process's peak memory; none
    // when only the `memory` line is asked for.
    if args.policies.iter().any(|p| p != "memory") || args.policies.is_empty() {
        let warm = filled(Selection::Fifo, WARM_UP_SIZE).await?;
        round(&warm, args.batches).await?;
    }
    let mut lines: Vec<(&str, Option<Selection>)> = vec![("memory", None)];
    lines.extend(policies().into_iter().map(|(name, s)| (name, Some(s))));
    for (name, selection) in lines {
        if !wanted(name) {
            continue;
        }
        let cases = match &selection {
            None => Cases::Floor(args.sizes.iter().map(|&e| Floor::new(e)).collect()),
            Some(selection) => {
                let mut bufs = Vec::with_capacity(args.sizes.len());
                for &eligible in &args.sizes {
                    bufs.push(filled(selection.clone(), eligible).await?);
                }
                Cases::Buffers(bufs)
            }
        };
        let figures = interleaved(&cases, args.sizes.len(), &args).await?;
        for (&eligible, (us, ratio)) in args.sizes.iter().zip(figures) {
            let lines = match selection {
                None => format!(", \"lines_per_sample\": {FLOOR_LINES}"),
                Some(_) => String::new(),
            };
            println!(
                "{{\"policy\": \"{name}\", \"eligible\": {eligible}, \"batch\": {BATCH}{lines}, \"us_per_batch\": {us:.2}, \"vs_smallest\": {ratio:.2}}}"
            );
        }
    }
    Ok(())
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("selection: {e}");
            std::process::exit(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("selection: no runtime: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = runtime.block_on(run(args)) {
        eprintln!("selection: {e}");
        std::process::exit(1);
    }
}
