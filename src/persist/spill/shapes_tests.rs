//! Tests of the walk by `parquet.thrift`'s shapes: files the `parquet` writer makes, with
//! the parts of the format the tables name, pass it; a known field of another type, a list
//! of another element type and a collection of booleans are refused, each of which the
//! walk by wire types alone lets through.

// `expect` and `unwrap` in this test code are its assertions, or fixtures that cannot fail
// (an in-memory store, a runtime, data the test built); library code has none
// (tests/layout.rs checks).

use super::checks::{check_chunk_pages, footer_metadata};
use super::shapes::{FILE_META_DATA, PAGE_HEADER};
use super::thrift::{put_varint, Thrift, STRUCT};
use crate::sync::Arc;
use arrow_array::builder::{ListBuilder, StringDictionaryBuilder};
use arrow_array::types::Int32Type;
use arrow_array::{
    ArrayRef, BinaryArray, BooleanArray, Date32Array, Decimal128Array, Float64Array, Int32Array,
    Int64Array, Int8Array, RecordBatch, StringArray, StructArray, Time64NanosecondArray,
    TimestampMicrosecondArray,
};
use arrow_schema::{DataType, Field};
use parquet::arrow::ArrowWriter;
use parquet::file::metadata::{KeyValue, ParquetMetaDataReader, SortingColumn};
use parquet::file::properties::{EnabledStatistics, WriterProperties, WriterVersion};

/// Walks `bytes` as a struct of `shape`; the bytes it read, or its error.
fn walk(shape: super::shapes::Shape, bytes: &[u8]) -> Result<usize, String> {
    let mut t = Thrift { bytes, at: 0 };
    t.walk(shape, STRUCT, 0).map(|()| t.at)
}

/// Steps over `bytes` as a struct by its wire types alone, as the check before this one did.
fn skip(bytes: &[u8]) -> Result<usize, String> {
    let mut t = Thrift { bytes, at: 0 };
    t.skip(STRUCT, 0, false).map(|()| t.at)
}

/// A Parquet file of three rows with columns of many logical types (strings, a dictionary,
/// decimals, timestamps, times, dates, 8-bit integers, a list, a struct, nulls), page
/// statistics, bloom filters, sorting columns and key-value metadata, written as `version`.
fn parquet_file(version: WriterVersion) -> Vec<u8> {
    let mut list = ListBuilder::new(arrow_array::builder::Int32Builder::new());
    for row in [vec![Some(1), None], vec![], vec![Some(3)]] {
        list.values().extend(row);
        list.append(true);
    }
    let mut dictionary = StringDictionaryBuilder::<Int32Type>::new();
    for v in ["a", "b", "a"] {
        dictionary.append_value(v);
    }
    let inner: ArrayRef = Arc::new(Int32Array::from(vec![7, 8, 9]));
    let columns: Vec<(&str, ArrayRef)> = vec![
        (
            "i32",
            Arc::new(Int32Array::from(vec![Some(1), None, Some(3)])),
        ),
        ("i64", Arc::new(Int64Array::from(vec![1, 2, 3]))),
        ("i8", Arc::new(Int8Array::from(vec![1, -2, 3]))),
        (
            "f64",
            Arc::new(Float64Array::from(vec![0.5, f64::NAN, 2.0])),
        ),
        (
            "bool",
            Arc::new(BooleanArray::from(vec![true, false, true])),
        ),
        ("text", Arc::new(StringArray::from(vec!["x", "y", "z"]))),
        (
            "bytes",
            Arc::new(BinaryArray::from(vec![&b"a"[..], b"", b"c"])),
        ),
        (
            "dec",
            Arc::new(
                Decimal128Array::from(vec![100, 200, 300])
                    .with_precision_and_scale(10, 2)
                    .expect("decimal"),
            ),
        ),
        (
            "ts",
            Arc::new(TimestampMicrosecondArray::from(vec![1, 2, 3]).with_timezone("UTC")),
        ),
        ("time", Arc::new(Time64NanosecondArray::from(vec![1, 2, 3]))),
        ("date", Arc::new(Date32Array::from(vec![1, 2, 3]))),
        ("list", Arc::new(list.finish())),
        ("dict", Arc::new(dictionary.finish())),
        (
            "struct",
            Arc::new(StructArray::from(vec![(
                Arc::new(Field::new("a", DataType::Int32, false)),
                inner,
            )])),
        ),
    ];
    let batch = RecordBatch::try_from_iter(columns).expect("batch");
    let props = WriterProperties::builder()
        .set_writer_version(version)
        .set_statistics_enabled(EnabledStatistics::Page)
        .set_bloom_filter_enabled(true)
        .set_sorting_columns(Some(vec![SortingColumn {
            column_idx: 1,
            descending: false,
            nulls_first: true,
        }]))
        .set_key_value_metadata(Some(vec![
            KeyValue::new("with".to_owned(), "value".to_owned()),
            KeyValue::new("without".to_owned(), None),
        ]))
        .build();
    let mut out = Vec::new();
    let mut writer = ArrowWriter::try_new(&mut out, batch.schema(), Some(props)).expect("writer");
    writer.write(&batch).expect("write");
    writer.close().expect("close");
    out
}

/// Every footer and page header the `parquet` writer makes passes, in both page formats.
#[test]
fn files_the_parquet_writer_makes_pass() {
    for version in [WriterVersion::PARQUET_1_0, WriterVersion::PARQUET_2_0] {
        let file = parquet_file(version);
        let metadata = footer_metadata(&file).expect("the footer passes");
        let footer = ParquetMetaDataReader::decode_metadata(metadata).expect("decodes");
        // The parts of the format the file was written to exercise are there.
        let group = footer.row_group(0);
        assert!(group.sorting_columns().is_some(), "{version:?}");
        assert!(footer.file_metadata().key_value_metadata().is_some());
        assert!(footer.file_metadata().column_orders().is_some());
        assert!(group.column(0).statistics().is_some());
        assert!(group.column(0).bloom_filter_offset().is_some());
        assert!(group
            .columns()
            .iter()
            .any(|c| c.dictionary_page_offset().is_some()));
        for column in group.columns() {
            check_chunk_pages(column, &file)
                .unwrap_or_else(|e| panic!("{version:?} {}: {e}", column.column_path()));
        }
    }
}

/// `metadata` (a footer's `FileMetaData`) with `fields` added before its stop byte.
fn with_fields(metadata: &[u8], fields: &[u8]) -> Vec<u8> {
    let mut out = metadata[..metadata.len() - 1].to_vec();
    out.extend_from_slice(fields);
    out.push(0);
    out
}

/// A field header in the long form (its type, then its id as a zigzag varint).
fn field(ty: u8, id: i16) -> Vec<u8> {
    let mut out = vec![ty];
    put_varint(&mut out, ((id << 1) ^ (id >> 15)) as u16 as u64);
    out
}

/// An unknown field (id 101) holding a list of 2^31 - 1 booleans in six bytes.
fn boolean_list() -> Vec<u8> {
    let mut out = field(9, 101);
    out.push(0xf1);
    put_varint(&mut out, i32::MAX as u64);
    out
}

/// The footer `num_rows` (field 3, an i64) given as binary holding a list of 2^31 - 1
/// booleans: the walk by wire types steps over the binary, but the `parquet` decoder reads
/// its length as the i64 and then the list as a field, which it steps over a second a time.
#[test]
fn a_known_field_of_another_type_is_refused() {
    let file = parquet_file(WriterVersion::PARQUET_1_0);
    let metadata = footer_metadata(&file).expect("the footer passes");
    let hidden = boolean_list();
    let mut fields = field(8, 3);
    put_varint(&mut fields, hidden.len() as u64);
    fields.extend_from_slice(&hidden);
    let damaged = with_fields(metadata, &fields);
    assert_eq!(
        skip(&damaged),
        Ok(damaged.len()),
        "the wire types alone pass it"
    );
    let err = walk(FILE_META_DATA, &damaged).expect_err("refused");
    assert!(
        err.contains("field 3: a binary where the format has a i64"),
        "{err}"
    );
}

/// A known list whose elements are of another type is refused (field 5, key-value
/// metadata, given one binary element instead of a struct).
#[test]
fn a_list_of_another_element_type_is_refused() {
    let bytes = [0x59, 0x18, 0x01, b'a', 0x00];
    assert_eq!(skip(&bytes), Ok(bytes.len()));
    let err = walk(FILE_META_DATA, &bytes).expect_err("refused");
    assert!(
        err.contains("field 5: element 0: a binary where the format has a struct"),
        "{err}"
    );
    // The same list of a struct passes, and so does an empty list written as one zero byte.
    let key_value = [0x59, 0x1c, 0x18, 0x01, b'k', 0x00, 0x00];
    assert_eq!(walk(FILE_META_DATA, &key_value), Ok(key_value.len()));
    assert_eq!(walk(FILE_META_DATA, &[0x59, 0x00, 0x00]), Ok(3));
}

/// A list, set or map of booleans in a field the decoder does not know is refused, even
/// when it fits (the decoder steps over it without reading its bytes, so it would read
/// them as fields); one of integers that fits is stepped over.
#[test]
fn collections_of_booleans_are_refused() {
    let file = parquet_file(WriterVersion::PARQUET_1_0);
    let metadata = footer_metadata(&file).expect("the footer passes");
    let unknown = |payload: &[u8]| {
        let mut fields = field(payload[0], 100);
        fields.extend_from_slice(&payload[1..]);
        with_fields(metadata, &fields)
    };
    // list of three true, set of two false, map of i32 -> bool, map of bool -> i32.
    for payload in [
        &[9, 0x31, 1, 1, 1][..],
        &[10, 0x22, 2, 2],
        &[11, 0x01, 0x51, 0x02, 1],
        &[11, 0x01, 0x15, 1, 0x02],
    ] {
        let damaged = unknown(payload);
        let err = walk(FILE_META_DATA, &damaged).expect_err("refused");
        assert!(
            err.contains("a collection of booleans"),
            "{payload:?}: {err}"
        );
    }
    // Inside a known struct too (a key-value pair with an unknown field 3).
    let nested = [0x59, 0x1c, 0x18, 0x01, b'k', 0x29, 0x11, 1, 0x00, 0x00];
    let err = walk(FILE_META_DATA, &nested).expect_err("refused");
    assert!(err.contains("a collection of booleans"), "{err}");
    for payload in [&[9, 0x35, 2, 4, 6][..], &[11, 0x01, 0x58, 0x02, 0x01, b'v']] {
        let fine = unknown(payload);
        assert_eq!(walk(FILE_META_DATA, &fine), Ok(fine.len()), "{payload:?}");
    }
}

/// A page header's known field of another type is refused, by the walk and by
/// `check_chunk_pages` on a real file with that byte changed.
#[test]
fn a_page_header_field_of_another_type_is_refused() {
    // type 0 (data page), uncompressed size 10, compressed size as an i64.
    let header = [0x15, 0x00, 0x15, 0x14, 0x16, 0x14, 0x00];
    assert_eq!(skip(&header), Ok(header.len()));
    let err = walk(PAGE_HEADER, &header).expect_err("refused");
    assert!(
        err.contains("field 3: a i64 where the format has a i32"),
        "{err}"
    );

    let mut file = parquet_file(WriterVersion::PARQUET_1_0);
    let footer = ParquetMetaDataReader::decode_metadata(footer_metadata(&file).expect("footer"))
        .expect("decodes");
    let column = footer.row_group(0).column(1).clone();
    let start = column
        .dictionary_page_offset()
        .unwrap_or(column.data_page_offset()) as usize;
    // The chunk's first page header opens with its type (0x15 and a one-byte value), then
    // field 2 as an i32.
    assert_eq!((file[start], file[start + 2]), (0x15, 0x15));
    check_chunk_pages(&column, &file).expect("passes as written");
    file[start + 2] = 0x16;
    let err = check_chunk_pages(&column, &file).expect_err("refused");
    assert!(
        err.contains("page at byte 0") && err.contains("field 2"),
        "{err}"
    );
}
