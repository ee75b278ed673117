//! Archive write throughput, in MB/s of logical input (the bytes of the tensors), for rows
//! of 1,024 int32 tokens and 1,024 float32 logprobs plus a float64 reward, zstd level 1:
//!
//! * `archive_writer`: samples -> Arrow -> Parquet -> an in-memory store, the whole path
//!   the buffer's archive takes;
//! * `bare_arrow_writer`: the same rows already as the Arrow `RecordBatch` the archive
//!   writes, written by `parquet::arrow::ArrowWriter` with the same properties: the
//!   baseline.
//!
//! Target (issue): >= 100 MB/s on one core, and >= 80% of the baseline.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;
use rollout_buffer::persist::{ArchiveWriter, ArchivedSample, Store};
use rollout_buffer::ExitReason;
use rollout_buffer::Sample;

const ROWS: usize = 1_024;
const TOKENS: usize = 1_024;

fn rows() -> Vec<ArchivedSample> {
    (0..ROWS)
        .map(|i| ArchivedSample {
            sample: Sample::new(format!("rollout-{i}"))
                .birth(i as u64 + 1)
                .with(
                    "tokens",
                    (0..TOKENS as i32)
                        .map(|t| (t * 7 + i as i32) % 50_000)
                        .collect::<Vec<_>>(),
                )
                .with(
                    "logprobs",
                    (0..TOKENS)
                        .map(|t| -((t % 97) as f32) / 13.0)
                        .collect::<Vec<_>>(),
                )
                .with("reward", i as f64 / ROWS as f64)
                .meta("environment", "math")
                .meta("policy_version", 7i64),
            read_by: vec!["train".into()],
            reason: ExitReason::Consumed,
        })
        .collect()
}

fn archive(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let rows = rows();
    let logical: usize = rows
        .iter()
        .map(|r| r.sample.fields().map(|(_, t)| t.nbytes()).sum::<usize>())
        .sum();
    let mut group = c.benchmark_group("archive_1024_rows_of_1024_tokens");
    group.throughput(Throughput::Bytes(logical as u64));
    group.sample_size(20);

    let writer = ArchiveWriter::new(Store::open("memory://").expect("store"));
    group.bench_function("archive_writer", |b| {
        b.iter(|| rt.block_on(writer.write(&rows)).expect("write"))
    });

    // Exactly the columns the archive writes (partition keys out, read_by and reason in).
    let batch = ArchiveWriter::record_batch(&rows).expect("arrow");
    let props = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(1).expect("level")))
        .build();
    group.bench_function("bare_arrow_writer", |b| {
        b.iter(|| {
            let mut buf = Vec::new();
            let mut w = ArrowWriter::try_new(&mut buf, batch.schema(), Some(props.clone()))
                .expect("writer");
            w.write(&batch).expect("write");
            w.close().expect("close");
            buf
        })
    });
    group.finish();
}

criterion_group!(benches, archive);
criterion_main!(benches);
