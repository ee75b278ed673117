//! A `Fifo` trainer over data ten times its buffer's memory budget, against the same run
//! with everything in memory.
//!
//! 8,192 samples of 64 KiB (8,192 tokens and their logprobs; 512 MiB) are put first, then
//! a trainer leases batches of 64 in `Fifo` order, reads every token and logprob (the
//! least a trainer does: copy them into its input tensors) and commits, until the buffer
//! is empty. With `--budget-frac 0.1` the buffer keeps at most 10% of the data in memory
//! and spills the rest to Parquet segments in a temporary directory on the local disk.
//! The spilling run and the in-memory run alternate for `--rounds` rounds (5), and the
//! figures are medians over them.
//!
//! `--touch last` reads one value per sample instead, which measures the hand-off alone;
//! `--compute-us N` adds N µs of work per sample (a trainer's forward and backward pass),
//! which the read-ahead overlaps with loading the next batch; `--sink` gives both buffers a
//! freed-sample sink (as the archive is), which gets every trained sample whole: spilled
//! ones with the fields their batch loaded, read back from nothing; `--only spill` makes
//! one spilling run and nothing else (for profiling).
//!
//! ```text
//! cargo run --release --example spill_fifo [-- --samples 8192 --batch 64 --budget-frac 0.1 --rounds 5]
//! ```
//!
//! Prints put and trainer throughput of both runs, their ratio, and the peak resident set
//! size of the process after the first spilling run (it runs first, so no in-memory run's
//! data is in the figure).

use rollout_buffer::{BufferConfig, RpcDef, Sample, SequenceBuffer};
use std::time::Instant;

const TOKENS: usize = 8192; // i32 tokens + f32 logprobs = 64 KiB per sample

struct Args {
    samples: usize,
    batch: usize,
    budget_frac: f64,
    touch_all: bool,
    compute_us: u64,
    /// Skip the in-memory run (for profiling the spilling one).
    spill_only: bool,
    /// Rounds of the two runs, alternating.
    rounds: usize,
    /// Give the buffers a freed-sample sink.
    sink: bool,
}

fn args() -> Args {
    let mut a = Args {
        samples: 8192,
        batch: 64,
        budget_frac: 0.1,
        touch_all: true,
        compute_us: 0,
        spill_only: false,
        rounds: 5,
        sink: false,
    };
    let mut argv: Vec<String> = std::env::args().skip(1).collect();
    if let Some(i) = argv.iter().position(|x| x == "--sink") {
        argv.remove(i);
        a.sink = true;
    }
    for pair in argv.chunks(2) {
        let value = pair.get(1).map(String::as_str).unwrap_or("");
        match pair[0].as_str() {
            "--samples" => a.samples = value.parse().unwrap_or(a.samples),
            "--batch" => a.batch = value.parse().unwrap_or(a.batch),
            "--budget-frac" => a.budget_frac = value.parse().unwrap_or(a.budget_frac),
            "--touch" => a.touch_all = value != "last",
            "--compute-us" => a.compute_us = value.parse().unwrap_or(0),
            "--only" => a.spill_only = value == "spill",
            "--rounds" => a.rounds = value.parse().unwrap_or(a.rounds).max(1),
            other => eprintln!("ignored argument {other}"),
        }
    }
    a
}

fn rollout(i: u64) -> Sample {
    let tokens: Vec<i32> = (0..TOKENS as i32)
        .map(|t| t.wrapping_mul(31) ^ i as i32)
        .collect();
    let logp: Vec<f32> = (0..TOKENS).map(|t| -((t % 97) as f32) * 0.01).collect();
    Sample::new(i).with("tokens", tokens).with("logp", logp)
}

/// The median of `values` (the mean of the middle two for an even count; 0 if none).
fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => 0.0,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// Peak resident set size of this process so far, in bytes (Linux; 0 elsewhere).
fn peak_rss() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// CPU time this process has used so far (user + system, all threads), in seconds (Linux;
/// 0 elsewhere).
fn cpu_seconds() -> f64 {
    cpu_seconds_of("/proc/self/stat")
}

/// CPU time of the calling thread (the trainer's), in seconds (Linux; 0 elsewhere).
fn thread_cpu_seconds() -> f64 {
    cpu_seconds_of("/proc/thread-self/stat")
}

fn cpu_seconds_of(stat: &str) -> f64 {
    std::fs::read_to_string(stat)
        .ok()
        .and_then(|s| {
            // Fields after the command name (which is in parentheses and may hold spaces).
            let rest = s.rsplit_once(')')?.1;
            let f: Vec<&str> = rest.split_whitespace().collect();
            let ticks = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
            Some(ticks / 100.0)
        })
        .unwrap_or(0.0)
}

/// A freed-sample sink that counts the samples it gets with both fields (an archive
/// would write them out).
#[derive(Debug, Default, Clone)]
struct Counted(std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl Counted {
    fn whole(&self) -> usize {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl rollout_buffer::FreedSink for Counted {
    fn consumed(&self, samples: Vec<std::sync::Arc<Sample>>, _read_by: &[String]) {
        let whole = samples
            .iter()
            .filter(|s| s.get("tokens").is_some() && s.get("logp").is_some())
            .count();
        self.0
            .fetch_add(whole, std::sync::atomic::Ordering::Relaxed);
    }
}

struct Run {
    put_per_s: f64,
    train_per_s: f64,
    spilled: u64,
    segments: u64,
    rewritten: u64,
    loads: u64,
    read_ahead: u64,
    peak_resident: u64,
    /// Fraction of the trainer's time spent waiting for batches.
    waiting: f64,
    /// CPU time (all threads) per trained sample, in µs.
    cpu_us: f64,
    /// CPU time of the trainer's thread per trained sample, in µs.
    trainer_cpu_us: f64,
}

async fn run(a: &Args, budget: Option<u64>) -> Result<Run, rollout_buffer::Error> {
    let mut config =
        BufferConfig::new(a.samples).rpc(RpcDef::new("train", a.batch).inputs(["tokens", "logp"]));
    if let Some(bytes) = budget {
        config = config.memory_budget(bytes);
    }
    let sink = Counted::default();
    if a.sink {
        config = config.freed_sink(sink.clone());
    }
    let buf = SequenceBuffer::with_config(config)?;
    // Samples are built as they are put (building them all first would put the whole data
    // set in memory and in the RSS figure); both runs pay the same for it.
    let mut peak_resident = 0u64;
    let start = Instant::now();
    for first in (0..a.samples as u64).step_by(a.batch) {
        let last = (first + a.batch as u64).min(a.samples as u64);
        buf.put_batch((first..last).map(rollout).collect()).await?;
        peak_resident = peak_resident.max(buf.stats().resident_bytes);
    }
    let put_s = start.elapsed().as_secs_f64();
    if a.spill_only {
        // A mark for attaching a profiler to the trainer phase alone.
        eprintln!("training (pid {})", std::process::id());
    }
    let start = Instant::now();
    let cpu_start = cpu_seconds();
    let trainer_cpu_start = thread_cpu_seconds();
    let mut trained = 0usize;
    let mut checksum = 0i64;
    let mut waited = std::time::Duration::ZERO;
    while trained < a.samples {
        let asked = Instant::now();
        let batch = buf.get_batch_for_rpc("train").await?;
        waited += asked.elapsed();
        for view in batch.samples() {
            let tokens = view.get("tokens").and_then(|t| t.array::<i32>());
            let logp = view.get("logp").and_then(|t| t.array::<f32>());
            if let (Some(tokens), Some(logp)) = (tokens, logp) {
                if a.touch_all {
                    checksum += tokens.iter().map(|&t| i64::from(t)).sum::<i64>();
                    checksum += logp.iter().sum::<f32>() as i64;
                } else {
                    checksum += i64::from(tokens[TOKENS - 1]);
                }
            }
        }
        if a.compute_us > 0 {
            // The trainer's step: it holds its thread, as a blocking CUDA sync would.
            let until = Instant::now()
                + std::time::Duration::from_micros(a.compute_us * batch.len() as u64);
            while Instant::now() < until {
                std::hint::spin_loop();
            }
        }
        trained += batch.len();
        batch.commit().await?;
        peak_resident = peak_resident.max(buf.stats().resident_bytes);
    }
    let train_s = start.elapsed().as_secs_f64();
    let cpu_us = (cpu_seconds() - cpu_start) * 1e6 / a.samples as f64;
    let trainer_cpu_us = (thread_cpu_seconds() - trainer_cpu_start) * 1e6 / a.samples as f64;

    std::hint::black_box(checksum);
    buf.flush().await?;
    if a.sink {
        // Every trained sample reached the sink, with both of its fields.
        assert_eq!(sink.whole(), a.samples, "samples the sink got whole");
    }
    let spill = buf.stats().spill;
    Ok(Run {
        put_per_s: a.samples as f64 / put_s,
        train_per_s: a.samples as f64 / train_s,
        spilled: spill.spilled_samples,
        segments: spill.segments_written - spill.segments_rewritten,
        rewritten: spill.segments_rewritten,
        loads: spill.loads,
        read_ahead: spill.shared_loads,
        peak_resident: if budget.is_some() { peak_resident } else { 0 },
        waiting: waited.as_secs_f64() / train_s,
        cpu_us,
        trainer_cpu_us,
    })
}

fn main() -> Result<(), rollout_buffer::Error> {
    let a = args();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| rollout_buffer::Error::InvalidConfig {
            detail: e.to_string(),
        })?;
    let data = (a.samples * TOKENS * 8) as u64;
    let budget = (data as f64 * a.budget_frac) as u64;
    println!(
        "{} samples of {} KiB ({} MiB), trainer batches of {} ({}, {} µs of compute per sample{}), memory budget {} MiB ({:.0}%)",
        a.samples,
        TOKENS * 8 / 1024,
        data >> 20,
        a.batch,
        if a.touch_all { "reading every value" } else { "reading one value per sample" },
        a.compute_us,
        if a.sink { ", a freed-sample sink" } else { "" },
        budget >> 20,
        a.budget_frac * 100.0
    );
    let rss_before = peak_rss();
    if a.spill_only {
        let spilled = runtime.block_on(run(&a, Some(budget)))?;
        println!(
            "spilling: put {:.0} samples/s, trainer {:.0} samples/s, waited {:.0}%, {:.0} µs CPU per sample ({:.0} µs in the trainer's thread); {} segments, {} rewritten",
            spilled.put_per_s,
            spilled.train_per_s,
            spilled.waiting * 100.0,
            spilled.cpu_us,
            spilled.trainer_cpu_us,
            spilled.segments,
            spilled.rewritten
        );
        return Ok(());
    }
    // Rounds alternate the two runs, and the figures are medians over rounds: the speed
    // of a shared machine drifts over seconds, and a ratio of two runs minutes apart
    // measures the drift as much as the buffer.
    let mut rounds: Vec<(Run, Run)> = Vec::with_capacity(a.rounds);
    let mut rss_spill = 0;
    for round in 1..=a.rounds {
        let spilled = runtime.block_on(run(&a, Some(budget)))?;
        if round == 1 {
            // Before any in-memory run has held the whole data set.
            rss_spill = peak_rss();
        }
        let memory = runtime.block_on(run(&a, None))?;
        println!(
            "round {round}: trainer {:.0} samples/s spilling, {:.0} all in memory: {:.2}x",
            spilled.train_per_s,
            memory.train_per_s,
            spilled.train_per_s / memory.train_per_s
        );
        rounds.push((spilled, memory));
    }
    let of = |f: &dyn Fn(&(Run, Run)) -> f64| median(rounds.iter().map(f).collect());
    let ratios: Vec<f64> = rounds
        .iter()
        .map(|(s, m)| s.train_per_s / m.train_per_s)
        .collect();
    let (low, high) = ratios
        .iter()
        .fold((f64::MAX, f64::MIN), |(l, h), &r| (l.min(r), h.max(r)));
    println!(
        "{:<16}{:>17}{:>21}   (medians of {} rounds)",
        "",
        "put (samples/s)",
        "trainer (samples/s)",
        rounds.len()
    );
    println!(
        "{:<16}{:>17.0}{:>21.0}",
        "all in memory",
        of(&|(_, m)| m.put_per_s),
        of(&|(_, m)| m.train_per_s)
    );
    println!(
        "{:<16}{:>17.0}{:>21.0}",
        "spilling",
        of(&|(s, _)| s.put_per_s),
        of(&|(s, _)| s.train_per_s)
    );
    println!(
        "trainer with spilling / in memory: {:.2}x (rounds {:.2}x to {:.2}x; put: {:.2}x)",
        median(ratios),
        low,
        high,
        of(&|(s, m)| s.put_per_s / m.put_per_s)
    );
    let (spilled, _) = &rounds[0];
    println!(
        "round 1 spilled {} samples in {} segments ({} segments rewritten); {} loaded back, {} of them read ahead before the trainer asked",
        spilled.spilled, spilled.segments, spilled.rewritten, spilled.loads, spilled.read_ahead
    );
    println!(
        "the trainer waited for batches {:.0}% of its time ({:.0}% all in memory)",
        of(&|(s, _)| s.waiting) * 100.0,
        of(&|(_, m)| m.waiting) * 100.0
    );
    println!(
        "CPU time per trained sample: {:.0} µs spilling ({:.0} in the trainer's thread), {:.0} µs in memory ({:.0})",
        of(&|(s, _)| s.cpu_us),
        of(&|(s, _)| s.trainer_cpu_us),
        of(&|(_, m)| m.cpu_us),
        of(&|(_, m)| m.trainer_cpu_us)
    );
    println!(
        "resident payload peak {} MiB (budget {} MiB + one batch {} MiB)",
        rounds
            .iter()
            .map(|(s, _)| s.peak_resident)
            .max()
            .unwrap_or(0)
            >> 20,
        budget >> 20,
        (a.batch * TOKENS * 8) >> 20
    );
    println!(
        "peak RSS of the first spilling run {} MiB ({} MiB before it; the data is {} MiB)",
        rss_spill >> 20,
        rss_before >> 20,
        data >> 20
    );
    Ok(())
}
