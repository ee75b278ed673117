//! Tests of the archive writer: partitions, bulky columns, widening earlier files.

// `expect` and `unwrap` in this test code are its assertions, or fixtures that cannot fail
// (an in-memory store, a runtime, data the test built); library code has none
// (tests/layout.rs checks).

use super::*;

fn rows(ids: std::ops::Range<usize>, field: &'static str) -> Vec<ArchivedSample> {
    ids.map(|i| ArchivedSample {
        sample: Sample::new(format!("s{i}"))
            .with(field, i as f64)
            .meta(ENVIRONMENT, "math"),
        read_by: vec!["train".into()],
        reason: ExitReason::Consumed,
    })
    .collect()
}

async fn columns(store: &Store, path: &str) -> Vec<String> {
    let bytes = store.get(path).await.expect("get").expect("there");
    let builder = ParquetRecordBatchReaderBuilder::try_new(bytes).expect("parquet");
    let names = builder.schema().fields().iter().map(|f| f.name().clone());
    names.collect()
}

/// A crash after a write stored a grown schema (and the widening mark) but before the
/// earlier files were rewritten: the next writer widens them when it loads the schema,
/// removes the mark, and every row reads back as written.
#[test]
fn a_widening_a_crash_interrupted_is_finished_by_the_next_writer() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let store = Store::open("memory://").expect("store");
        let first = rows(0..3, "reward");
        let narrow = ArchiveWriter::new(store.clone())
            .write(&first)
            .await
            .expect("write");
        // What the crashed write left: the mark, then the grown schema, no files.
        let later = rows(3..5, "advantage");
        let batch = ArchiveWriter::record_batch(&later).expect("batch");
        let known = archive_schema::load(&store).await.expect("load");
        let grown = archive_schema::merge(known.as_ref(), &batch.schema(), &Default::default())
            .expect("merge");
        store
            .put(archive_schema::WIDENING_FILE, Bytes::new())
            .await
            .expect("mark");
        let schema_file = archive_schema::encode(&store, &grown).expect("encode");
        store
            .put(archive_schema::SCHEMA_FILE, schema_file)
            .await
            .expect("schema");
        assert_eq!(
            columns(&store, &narrow[0]).await.len() + 1,
            grown.fields().len()
        );

        let writer = ArchiveWriter::new(store.clone());
        let wide = writer.write(&later).await.expect("write");
        let want: Vec<String> = grown.fields().iter().map(|f| f.name().clone()).collect();
        for path in narrow.iter().chain(&wide) {
            assert_eq!(columns(&store, path).await, want, "{path}");
        }
        let mark = store.get(archive_schema::WIDENING_FILE).await.expect("get");
        assert!(mark.is_none(), "the mark is removed");
        let mut got = writer.read_all().await.expect("read");
        got.sort_by(|a, b| a.sample.id().cmp(b.sample.id()));
        let mut all = first;
        all.extend(later);
        assert!(got == all, "every row reads back as written");
    });
}

/// A file with a column the schema lacks (or of another type) is never widened: that
/// would drop the column.
#[test]
fn only_files_whose_columns_the_schema_holds_are_widened() {
    let a = Field::new("a", DataType::Int64, true);
    let b = Field::new("b", DataType::Utf8, true);
    let schema = Schema::new(vec![a.clone(), b.clone()]);
    assert!(archive_schema::widens(
        &Schema::new(vec![a.clone()]),
        &schema
    ));
    assert!(archive_schema::widens(
        &Schema::new(vec![b.clone()]),
        &schema
    ));
    assert!(!archive_schema::widens(&schema, &schema), "already wide");
    let other = Field::new("c", DataType::Int64, true);
    assert!(!archive_schema::widens(&Schema::new(vec![other]), &schema));
    let retyped = Field::new("a", DataType::Float64, true);
    assert!(!archive_schema::widens(
        &Schema::new(vec![retyped]),
        &schema
    ));
}

#[test]
fn partition_values_round_trip_through_paths() {
    for env in ["math", "code/python", "a b=c%"] {
        let s = Sample::new("x")
            .meta(ENVIRONMENT, env)
            .meta(POLICY_VERSION, 7i64);
        let dir = partition_dir(&s).unwrap_or_default();
        assert!(!dir["archive/".len()..].contains("//"));
        assert_eq!(dir.matches('/').count(), 2, "{dir}");
        assert_eq!(partition_values(&dir), (Some(env.to_string()), Some(7)));
    }
    let bare = partition_dir(&Sample::new("y")).unwrap_or_default();
    assert_eq!(partition_values(&bare), (None, None));
    assert!(bare.contains(NULL_PARTITION));
    let literal = Sample::new("z").meta(ENVIRONMENT, NULL_PARTITION);
    let dir = partition_dir(&literal).unwrap_or_default();
    assert_eq!(partition_values(&dir).0.as_deref(), Some(NULL_PARTITION));
    let wrong = Sample::new("w").meta(POLICY_VERSION, "v3");
    assert!(matches!(partition_dir(&wrong), Err(Error::Arrow { .. })));
}

#[test]
fn only_bulky_text_and_binary_columns_lose_dictionary_and_statistics() {
    let chat = "x".repeat(BULKY_VALUE_BYTES + 1);
    let columns: Vec<(&str, ArrayRef)> = vec![
        ("id", Arc::new(StringArray::from(vec!["a", "b"]))),
        ("chat", Arc::new(StringArray::from(vec![chat.as_str(); 2]))),
        (
            "blob",
            Arc::new(arrow_array::BinaryArray::from(vec![chat.as_bytes(); 2])),
        ),
        // Exactly the bound on average: not bulky.
        (
            "edge",
            Arc::new(StringArray::from(vec!["y".repeat(BULKY_VALUE_BYTES); 2])),
        ),
        (
            "reward",
            Arc::new(arrow_array::Float64Array::from(vec![1.0, 0.0])),
        ),
        (
            "chats",
            Arc::new(ListArray::new(
                Arc::new(Field::new("item", DataType::Utf8, false)),
                OffsetBuffer::from_lengths([3, 1]),
                Arc::new(StringArray::from(vec![chat.as_str(); 4])),
                None,
            )),
        ),
    ];
    let batch = RecordBatch::try_from_iter(columns).expect("batch");
    let props = bulky_columns_plain(WriterProperties::default(), &batch);
    for (name, bulky) in [
        ("id", false),
        ("chat", true),
        ("blob", true),
        ("edge", false),
        ("reward", false),
        ("chats.list.item", true),
    ] {
        let path = ColumnPath::new(name.split('.').map(str::to_owned).collect());
        assert_eq!(props.dictionary_enabled(&path), !bulky, "{name}");
        let none = props.statistics_enabled(&path) == EnabledStatistics::None;
        assert_eq!(none, bulky, "{name}");
    }
    // The paths are the writer's own: the bulky chunks come out plain, without min / max.
    let mut file = Vec::new();
    let mut writer = ArrowWriter::try_new(&mut file, batch.schema(), Some(props)).expect("writer");
    writer.write(&batch).expect("write");
    writer.close().expect("close");
    let reader = parquet::file::reader::SerializedFileReader::new(Bytes::from(file)).expect("read");
    let group = parquet::file::reader::FileReader::metadata(&reader)
        .row_group(0)
        .clone();
    for chunk in group.columns() {
        let name = chunk.column_path().string();
        let bulky = ["chat", "blob", "chats.list.item"].contains(&name.as_str());
        assert_eq!(chunk.statistics().is_none(), bulky, "{name}");
        assert_eq!(chunk.dictionary_page_offset().is_none(), bulky, "{name}");
    }
}
