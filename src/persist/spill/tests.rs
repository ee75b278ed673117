//! Tests of Parquet spill segments: rows read back as written on every store, views of
//! plain columns, plain storage of incompressible columns, large binary columns, the
//! fallback to Parquet's reader, and create-only writes.

// `expect` and `unwrap` in this test code are its assertions, or fixtures that cannot fail
// (an in-memory store, a runtime, data the test built); library code has none
// (tests/layout.rs checks).

use super::thrift::put_varint;
use super::*;
use crate::persist::codec::{put_tensor, Writer};
use crate::tensor::Tensor;
use arrow_array::{LargeBinaryArray, RecordBatch};
use arrow_schema::{Field, Schema};
use bytes::Bytes;
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::metadata::{ColumnChunkMetaDataBuilder, ParquetMetaDataReader};

fn row(i: i32) -> Fields {
    let mut f = Fields::default();
    // 64 KiB: a segment of 40 rows spans two row groups.
    f.set(FieldKey::from("tokens"), Tensor::from(vec![i; 16 << 10]));
    if i % 2 == 0 {
        f.set(
            FieldKey::from("logp"),
            Tensor::from(vec![-0.5f32 * i as f32; 300]),
        );
    }
    f
}

fn row_groups(spill: &ParquetSpill, segment: &Segment) -> Option<usize> {
    spill
        .footers
        .lock()
        .get(&segment.id)
        .map(|f| f.metadata().num_row_groups())
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime")
}

/// Rows read back equal the rows written, in the order asked for, with only the
/// fields asked for; a row without a field reads back without it.
#[test]
fn rows_read_back_as_written() {
    runtime().block_on(async {
        let spill = ParquetSpill::new(Store::open("memory://").expect("store"));
        let rows: Vec<Fields> = (0..40).map(row).collect();
        let segment = spill.write(rows.clone()).await.expect("write");
        assert_eq!(row_groups(&spill, &segment), Some(2));
        let keys = vec![FieldKey::from("tokens"), FieldKey::from("logp")];
        let got = spill
            .read(Arc::clone(&segment), vec![33, 2, 17], keys)
            .await
            .expect("read");
        assert_eq!(got, vec![row(33), row(2), row(17)]);
        // Every row has `tokens`: its arrays are views of the decoded pages.
        let viewed = got
            .iter()
            .filter(|f| format!("{:?}", f.get("tokens")).contains("Borrowed"))
            .count();
        assert_eq!(viewed, if cfg!(target_endian = "little") { 3 } else { 0 });
        let tokens_only = spill
            .read(segment, vec![4], vec![FieldKey::from("tokens")])
            .await
            .expect("read");
        assert_eq!(tokens_only[0].len(), 1);
        assert_eq!(tokens_only[0].get("tokens"), row(4).get("tokens"));
    });
}

/// Rows of 32 KiB of noise (which zstd cannot shrink) and 16 KiB of one repeated
/// number (which it can).
fn noisy_rows(n: usize) -> Vec<Fields> {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    (0..n)
        .map(|i| {
            let noise: Vec<i64> = (0..4096)
                .map(|_| {
                    // xorshift64: bytes zstd cannot predict.
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    state as i64
                })
                .collect();
            let mut f = Fields::default();
            f.set(FieldKey::from("noise"), Tensor::from(noise));
            f.set(FieldKey::from("flat"), Tensor::from(vec![i as f32; 4096]));
            f
        })
        .collect()
}

/// The arrays of a plain column are views of the fetched bytes, in every row group,
/// on local disk (a buffer per range) and in memory (slices of the stored file), and
/// after a restart (the footer fetched from the file).
#[test]
fn plain_columns_read_back_as_views_on_every_store() {
    runtime().block_on(async {
        let local = ParquetSpill::temporary().expect("store");
        let url = local.store.url().to_owned();
        let memory = ParquetSpill::new(Store::open("memory://").expect("store"));
        // 48 KiB rows: 80 of them make two row groups.
        let rows = noisy_rows(80);
        for spill in [&local, &memory] {
            let segment = spill.write(rows.clone()).await.expect("write");
            assert_eq!(row_groups(spill, &segment), Some(2));
            let restarted = ParquetSpill::new(spill.store.clone());
            for reader in [spill, &restarted] {
                let keys = vec![FieldKey::from("noise"), FieldKey::from("flat")];
                let got = reader
                    .read(Arc::clone(&segment), vec![5, 70, 1, 66], keys)
                    .await
                    .expect("read");
                let want: Vec<Fields> = [5, 70, 1, 66].iter().map(|&i| rows[i].clone()).collect();
                assert_eq!(got, want);
                let viewed = got
                    .iter()
                    .flat_map(|f| f.iter())
                    .filter(|(_, t)| format!("{t:?}").contains("Borrowed"))
                    .count();
                let store = reader.store.url();
                let expect = if cfg!(target_endian = "little") { 8 } else { 0 };
                assert_eq!(viewed, expect, "{store} (local: {url})");
            }
        }
    });
}

/// A column zstd cannot shrink is stored plain, one it can is compressed; both read
/// back as written.
#[test]
fn incompressible_columns_are_stored_plain() {
    runtime().block_on(async {
        let spill = ParquetSpill::new(Store::open("memory://").expect("store"));
        let rows = noisy_rows(8);
        let segment = spill.write(rows.clone()).await.expect("write");
        let footer = spill
            .footers
            .lock()
            .get(&segment.id)
            .cloned()
            .expect("footer");
        let codecs: Vec<(String, Compression)> = footer.metadata().row_groups()[0]
            .columns()
            .iter()
            .map(|c| (c.column_path().string(), c.compression()))
            .collect();
        assert!(codecs.contains(&("noise".to_owned(), Compression::UNCOMPRESSED)));
        assert!(codecs
            .iter()
            .any(|(k, c)| k == "flat" && matches!(c, Compression::ZSTD(_))));
        let keys = vec![FieldKey::from("noise"), FieldKey::from("flat")];
        let got = spill
            .read(segment, vec![7, 0, 3], keys)
            .await
            .expect("read");
        assert_eq!(got, vec![rows[7].clone(), rows[0].clone(), rows[3].clone()]);
    });
}

/// Segments with large-binary columns (values over 4 GiB, and segments written before
/// view columns) read back too.
#[test]
fn large_binary_segments_read_back() {
    runtime().block_on(async {
        let store = Store::open("memory://").expect("store");
        let rows: Vec<Fields> = (0..8).map(row).collect();
        let mut w = Writer::default();
        let column: LargeBinaryArray = rows
            .iter()
            .map(|r| {
                r.get("tokens").map(|t| {
                    w.buf.clear();
                    put_tensor(&mut w, t);
                    w.buf.clone()
                })
            })
            .collect();
        let schema = Arc::new(Schema::new(vec![Field::new(
            "tokens",
            arrow_schema::DataType::LargeBinary,
            true,
        )]));
        let batch =
            RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(column)]).expect("batch");
        let mut writer = ArrowWriter::try_new(Vec::new(), schema, None).expect("writer");
        writer.write(&batch).expect("write");
        let bytes = Bytes::from(writer.into_inner().expect("close"));
        store.put(&segment_path(7), bytes).await.expect("put");
        // A fresh spill store: the footer is fetched, as after a restart.
        let spill = ParquetSpill::new(store);
        let got = spill
            .read(
                spill.segment(7, 8),
                vec![5, 0],
                vec![FieldKey::from("tokens")],
            )
            .await
            .expect("read");
        assert_eq!(got[0].get("tokens"), row(5).get("tokens"));
        assert_eq!(got[1].get("tokens"), row(0).get("tokens"));
    });
}

/// Segment `segment` of `store` with each column chunk's metadata in its footer changed
/// by `change` (given the column's name; the chunks' bytes stay), stored as segment 99.
async fn store_with_changed_footer(
    store: &Store,
    segment: &Segment,
    change: impl Fn(&str, ColumnChunkMetaDataBuilder) -> ColumnChunkMetaDataBuilder,
) {
    use parquet::file::metadata::{ParquetMetaData, ParquetMetaDataWriter};
    let bytes = store.get(&segment.path).await.expect("get").expect("there");
    let meta = ParquetMetaDataReader::new()
        .parse_and_finish(&bytes)
        .expect("footer");
    let row_groups = meta
        .row_groups()
        .iter()
        .map(|rg| {
            let columns = rg
                .columns()
                .iter()
                .map(|c| {
                    let name = c.column_descr().name().to_owned();
                    change(&name, c.clone().into_builder())
                        .build()
                        .expect("column")
                })
                .collect();
            rg.clone()
                .into_builder()
                .set_column_metadata(columns)
                .build()
                .expect("row group")
        })
        .collect();
    let footer_len = u32::from_le_bytes(
        bytes[bytes.len() - 8..bytes.len() - 4]
            .try_into()
            .expect("4 bytes"),
    ) as usize;
    let mut out = bytes[..bytes.len() - 8 - footer_len].to_vec();
    let damaged = ParquetMetaData::new(meta.file_metadata().clone(), row_groups);
    ParquetMetaDataWriter::new(&mut out, &damaged)
        .with_preserve_page_index_locations(false)
        .finish()
        .expect("footer");
    store
        .put(&segment_path(99), Bytes::from(out))
        .await
        .expect("put");
}

/// A chunk the direct page decoder rejects (here: its footer says the chunk holds
/// fewer uncompressed bytes than its page does, which the decoder takes for damage and
/// Parquet's reader does not check) is read by Parquet's reader instead.
#[test]
fn a_chunk_the_page_decoder_rejects_is_read_by_parquet() {
    runtime().block_on(async {
        let store = Store::open("memory://").expect("store");
        let spill = ParquetSpill::new(store.clone());
        let segment = spill.write((0..4).map(row).collect()).await.expect("write");
        store_with_changed_footer(&store, &segment, |_, c| c.set_total_uncompressed_size(1)).await;
        let reader = ParquetSpill::new(store);
        let got = reader
            .read(
                reader.segment(99, 4),
                vec![3, 1],
                vec![FieldKey::from("tokens")],
            )
            .await
            .expect("read");
        assert_eq!(got[0].get("tokens"), row(3).get("tokens"));
        assert_eq!(got[1].get("tokens"), row(1).get("tokens"));
    });
}

/// A footer giving a column chunk a negative offset or size is an error naming the
/// segment and the column, also when the chunk is one the read does not ask for and the
/// chunk it asks for goes to Parquet's reader (which asserts every chunk of a row group it
/// reads is not negative: it panicked on such a footer).
#[test]
fn a_negative_chunk_offset_or_size_is_an_error_not_a_panic() {
    type Change = fn(ColumnChunkMetaDataBuilder) -> ColumnChunkMetaDataBuilder;
    let changes: [(&str, Change); 3] = [
        ("offset", |c| c.set_data_page_offset(-3)),
        ("dictionary offset", |c| {
            c.set_dictionary_page_offset(Some(-8))
        }),
        ("size", |c| c.set_total_compressed_size(-1)),
    ];
    for (what, change) in changes {
        runtime().block_on(async {
            let store = Store::open("memory://").expect("store");
            let spill = ParquetSpill::new(store.clone());
            let segment = spill.write((0..4).map(row).collect()).await.expect("write");
            // `tokens` is left to Parquet's reader (see the test above); `logp` is damaged.
            store_with_changed_footer(&store, &segment, |name, c| match name {
                "logp" => change(c),
                _ => c.set_total_uncompressed_size(1),
            })
            .await;
            let reader = ParquetSpill::new(store);
            for keys in [vec!["tokens"], vec!["logp"], vec!["tokens", "logp"]] {
                let keys = keys.into_iter().map(FieldKey::from).collect();
                let err = reader
                    .read(reader.segment(99, 4), vec![2], keys)
                    .await
                    .expect_err(what);
                let msg = err.to_string();
                assert!(
                    msg.contains("`logp`")
                        && msg.contains("negative")
                        && msg.contains(&segment_path(99)),
                    "{what}: {msg}"
                );
            }
        });
    }
}

/// `file` (a Parquet file) with fields its footer's decoder does not know added to the
/// footer's `FileMetaData`: `pad` bytes of binary (id 100) if `pad` > 0, then, if
/// `hostile`, a list declaring 2^31 - 1 booleans (id 101) in five bytes.
fn with_unknown_footer_fields(file: &[u8], pad: usize, hostile: bool) -> Bytes {
    let len = u32::from_le_bytes(file[file.len() - 8..file.len() - 4].try_into().expect("4"));
    let start = file.len() - 8 - len as usize;
    // The metadata ends with its struct's stop byte: the new fields go before it.
    let mut metadata = file[start..file.len() - 9].to_vec();
    if pad > 0 {
        metadata.extend_from_slice(&[0x08, 0xc8, 0x01]); // binary, field id 100
        put_varint(&mut metadata, pad as u64);
        metadata.extend(std::iter::repeat_n(b'x', pad));
    }
    if hostile {
        metadata.extend_from_slice(&[0x09, 0xca, 0x01]); // list, field id 101
        metadata.push(0xf1); // of booleans, its size in a varint
        put_varint(&mut metadata, i32::MAX as u64);
    }
    metadata.push(0);
    let mut out = file[..start].to_vec();
    out.extend_from_slice(&metadata);
    out.extend_from_slice(&(metadata.len() as u32).to_le_bytes());
    out.extend_from_slice(b"PAR1");
    Bytes::from(out)
}

/// A footer declaring a list of more elements than it has bytes (2^31 - 1 booleans in an
/// unknown field: Parquet's decoder steps over them one empty iteration at a time, a
/// second per list; found by `fuzz/`, target `spill_segment`) is refused before it is
/// decoded, naming the segment, also when the footer is longer than the first ranged read.
/// Unknown fields that do fit are read past, as Parquet's decoder does.
#[test]
fn a_footer_declaring_more_elements_than_bytes_is_refused() {
    runtime().block_on(async {
        let store = Store::open("memory://").expect("store");
        let spill = ParquetSpill::new(store.clone());
        let segment = spill.write((0..4).map(row).collect()).await.expect("write");
        let file = store.get(&segment.path).await.expect("get").expect("there");
        for pad in [0, 100 << 10] {
            for hostile in [false, true] {
                let changed = with_unknown_footer_fields(&file, pad, hostile);
                store.put(&segment_path(99), changed).await.expect("put");
                // A fresh reader fetches the footer from the file, as after a restart.
                let reader = ParquetSpill::new(store.clone());
                let got = reader
                    .read(
                        reader.segment(99, 4),
                        vec![2],
                        vec![FieldKey::from("tokens")],
                    )
                    .await;
                match (hostile, got) {
                    (false, Ok(rows)) => assert_eq!(rows[0].get("tokens"), row(2).get("tokens")),
                    (true, Err(e)) => {
                        let msg = e.to_string();
                        assert!(
                            msg.contains("footer metadata") && msg.contains(&segment_path(99)),
                            "pad {pad}: {msg}"
                        );
                    }
                    (hostile, got) => panic!("pad {pad}, hostile {hostile}: {got:?}"),
                }
                store.delete(&segment_path(99)).await.expect("delete");
            }
        }
    });
}

/// A footer read of a segment shorter than the size it was read with (replaced since) is
/// an error naming the segment, whether the store refuses the range (as the memory store
/// does) or answers with fewer bytes (which `fetch_range` refuses), never a slice past
/// the bytes it returned.
#[test]
fn a_segment_shorter_than_its_size_is_an_error() {
    runtime().block_on(async {
        let store = Store::open("memory://").expect("store");
        let spill = ParquetSpill::new(store.clone());
        let segment = spill.write((0..4).map(row).collect()).await.expect("write");
        let file = store.get(&segment.path).await.expect("get").expect("there");
        store
            .put(&segment_path(99), file.slice(..file.len() - 100))
            .await
            .expect("put");
        let err = super::read::fetch_metadata(&store, &segment_path(99), file.len() as u64)
            .await
            .expect_err("shorter than its size");
        assert!(err.to_string().contains(&segment_path(99)), "{err}");
    });
}

/// A process whose clock is behind the one before it (resumed on another machine)
/// takes names of segments live samples need; its writes move past them instead of
/// replacing them, and a folder whose names keep being taken is an error, not a loop.
#[test]
fn writes_never_replace_a_segment() {
    runtime().block_on(async {
        let store = Store::open("memory://").expect("store");
        let earlier = ParquetSpill::new(store.clone());
        let first = earlier.write(vec![row(1)]).await.expect("write");
        let second = earlier.write(vec![row(2)]).await.expect("write");
        let behind = ParquetSpill::new(store.clone());
        behind.next.store(first.id, Ordering::Relaxed);
        let third = behind.write(vec![row(3)]).await.expect("write");
        assert!(third.id > second.id, "{} after {}", third.id, second.id);
        let keys = vec![FieldKey::from("tokens"), FieldKey::from("logp")];
        for (segment, i) in [(first, 1), (second, 2), (Arc::clone(&third), 3)] {
            let reader = ParquetSpill::new(store.clone());
            let got = reader
                .read(reader.segment(segment.id, 1), vec![0], keys.clone())
                .await
                .expect("read");
            assert_eq!(got, vec![row(i)], "segment {}", segment.id);
        }
        // The next write follows on without another collision.
        let fourth = behind.write(vec![row(4)]).await.expect("write");
        assert_eq!(fourth.id, third.id + 1);

        // Every name taken: a typed error naming the store's folder.
        let taken = Store::from_object_store(Arc::new(AlwaysTaken::default()), "");
        let err = ParquetSpill::new(taken)
            .write(vec![row(5)])
            .await
            .expect_err("every name taken");
        assert!(
            matches!(&err, crate::Error::Storage { path, detail, .. }
                if path.starts_with("spill/") && detail.contains("taken")),
            "{err}"
        );
    });
}

/// A put that landed but was reported as a taken name (its reply lost, the retry refused)
/// is the write's own segment: no second name is taken and nothing is left behind.
#[test]
fn a_write_whose_reply_was_lost_keeps_its_segment() {
    runtime().block_on(async {
        let inner = Arc::new(AlwaysTaken(Default::default(), true));
        let store = Store::from_object_store(Arc::clone(&inner) as _, "");
        let spill = ParquetSpill::new(store.clone());
        let first = spill.next.load(Ordering::Relaxed);
        let segment = spill.write(vec![row(1)]).await.expect("write");
        assert_eq!(segment.id, first, "the landed name is kept");
        assert_eq!(
            store.list(SPILL_DIR).await.expect("list"),
            vec![segment_path(first)]
        );
        let keys = vec![FieldKey::from("tokens"), FieldKey::from("logp")];
        let got = spill.read(segment, vec![0], keys).await.expect("read");
        assert_eq!(got, vec![row(1)]);
    });
}

/// An in-memory store where every name a create-only put asks for is taken; with `lands`,
/// the put lands first (what a client sees when it retries a put whose reply was lost).
#[derive(Debug, Default)]
struct AlwaysTaken(object_store::memory::InMemory, bool);

impl std::fmt::Display for AlwaysTaken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AlwaysTaken")
    }
}

#[async_trait::async_trait]
impl object_store::ObjectStore for AlwaysTaken {
    async fn put_opts(
        &self,
        location: &object_store::path::Path,
        payload: object_store::PutPayload,
        opts: object_store::PutOptions,
    ) -> object_store::Result<object_store::PutResult> {
        if opts.mode == object_store::PutMode::Create {
            if self.1 {
                self.0
                    .put_opts(location, payload, object_store::PutOptions::default())
                    .await?;
            }
            return Err(object_store::Error::AlreadyExists {
                path: location.to_string(),
                source: "taken".into(),
            });
        }
        self.0.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &object_store::path::Path,
        opts: object_store::PutMultipartOptions,
    ) -> object_store::Result<Box<dyn object_store::MultipartUpload>> {
        self.0.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &object_store::path::Path,
        options: object_store::GetOptions,
    ) -> object_store::Result<object_store::GetResult> {
        self.0.get_opts(location, options).await
    }

    fn delete_stream(
        &self,
        locations: futures::stream::BoxStream<
            'static,
            object_store::Result<object_store::path::Path>,
        >,
    ) -> futures::stream::BoxStream<'static, object_store::Result<object_store::path::Path>> {
        self.0.delete_stream(locations)
    }

    fn list(
        &self,
        prefix: Option<&object_store::path::Path>,
    ) -> futures::stream::BoxStream<'static, object_store::Result<object_store::ObjectMeta>> {
        self.0.list(prefix)
    }

    async fn list_with_delimiter(
        &self,
        prefix: Option<&object_store::path::Path>,
    ) -> object_store::Result<object_store::ListResult> {
        self.0.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &object_store::path::Path,
        to: &object_store::path::Path,
        options: object_store::CopyOptions,
    ) -> object_store::Result<()> {
        self.0.copy_opts(from, to, options).await
    }
}
