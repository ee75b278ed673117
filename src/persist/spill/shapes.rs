//! The shapes `parquet.thrift` gives a footer's `FileMetaData` and a page's `PageHeader`,
//! and a walk of Thrift bytes that follows them ([`Thrift::walk`]).
//!
//! The `parquet` decoder reads a field it knows as the type the format declares for it,
//! whatever type the bytes give the field, and steps over a field it does not know by the
//! bytes' own type; but it steps over a list, set or map of booleans without reading their
//! elements, which take a byte each on the wire. So a walk by the bytes' types alone
//! ([`Thrift::skip`]) can read damaged bytes differently from the decoder: a known field
//! given another type, or an unknown list of booleans, leaves the two at different places,
//! and what the decoder reads from there the walk never saw as fields (found by `fuzz/`,
//! target `spill_segment`: a footer the type-directed walk passed still held the decoder
//! for about a second per list of 2^31 booleans inside it).
//!
//! [`Thrift::walk`] refuses both: a field the format knows must carry the format's type
//! (and a list its element type), and no list, set or map of booleans is stepped over. Then
//! the decoder reads every byte as the walk did, so its work is bounded by the bytes'
//! length, as the walk's is. A valid file never meets either refusal: its writer wrote each
//! field as declared, and neither struct holds a collection of booleans.
//!
//! The tables follow `parquet.thrift` as the `parquet` crate (version 60) decodes it,
//! including fields the crate steps over (a stricter check than it needs, never a looser
//! one). A field missing here is stepped over by its own type, as the decoder does.

use super::thrift::{
    Thrift, BINARY, BOOL_FALSE, BOOL_TRUE, BYTE, DOUBLE, I16, I32, I64, LIST, MAX_DEPTH, STRUCT,
};

/// What a field, or a list's element, holds.
#[derive(Clone, Copy, Debug)]
pub(super) enum Shape {
    /// A boolean field (its value is in the field's type byte; never a list's element here).
    Bool,
    /// An `i8`.
    Byte,
    /// An integer or an enum, on the wire as the given type (`I16`, `I32` or `I64`).
    Int(u8),
    /// A `double`.
    Double,
    /// A `binary` or a `string`.
    Binary,
    /// A `list` of the given element.
    List(&'static Shape),
    /// A struct or a union, by field id.
    Struct(&'static [(i16, Shape)]),
}

use Shape::{Binary, Bool, Byte, Double, Int, List, Struct};

const EMPTY: Shape = Struct(&[]);
const STRING: Shape = Binary;
const ENUM: Shape = Int(I32);

const KEY_VALUE: Shape = Struct(&[(1, STRING), (2, STRING)]);

const TIME_UNIT: Shape = Struct(&[(1, EMPTY), (2, EMPTY), (3, EMPTY)]);

const LOGICAL_TYPE: Shape = Struct(&[
    (1, EMPTY),
    (2, EMPTY),
    (3, EMPTY),
    (4, EMPTY),
    (5, Struct(&[(1, Int(I32)), (2, Int(I32))])),
    (6, EMPTY),
    (7, Struct(&[(1, Bool), (2, TIME_UNIT)])),
    (8, Struct(&[(1, Bool), (2, TIME_UNIT)])),
    (10, Struct(&[(1, Byte), (2, Bool)])),
    (11, EMPTY),
    (12, EMPTY),
    (13, EMPTY),
    (14, EMPTY),
    (15, EMPTY),
    (16, Struct(&[(1, Byte)])),
    (17, Struct(&[(1, STRING)])),
    (18, Struct(&[(1, STRING), (2, ENUM)])),
    (19, EMPTY),
]);

const SCHEMA_ELEMENT: Shape = Struct(&[
    (1, ENUM),
    (2, Int(I32)),
    (3, ENUM),
    (4, STRING),
    (5, Int(I32)),
    (6, ENUM),
    (7, Int(I32)),
    (8, Int(I32)),
    (9, Int(I32)),
    (10, LOGICAL_TYPE),
]);

const STATISTICS: Shape = Struct(&[
    (1, Binary),
    (2, Binary),
    (3, Int(I64)),
    (4, Int(I64)),
    (5, Binary),
    (6, Binary),
    (7, Bool),
    (8, Bool),
    (9, Int(I64)),
]);

const PAGE_ENCODING_STATS: Shape = Struct(&[(1, ENUM), (2, ENUM), (3, Int(I32))]);

const SIZE_STATISTICS: Shape = Struct(&[(1, Int(I64)), (2, List(&Int(I64))), (3, List(&Int(I64)))]);

const BOUNDING_BOX: Shape = Struct(&[
    (1, Double),
    (2, Double),
    (3, Double),
    (4, Double),
    (5, Double),
    (6, Double),
    (7, Double),
    (8, Double),
]);

const GEOSPATIAL_STATISTICS: Shape = Struct(&[(1, BOUNDING_BOX), (2, List(&Int(I32)))]);

const COLUMN_META_DATA: Shape = Struct(&[
    (1, ENUM),
    (2, List(&ENUM)),
    (3, List(&STRING)),
    (4, ENUM),
    (5, Int(I64)),
    (6, Int(I64)),
    (7, Int(I64)),
    (8, List(&KEY_VALUE)),
    (9, Int(I64)),
    (10, Int(I64)),
    (11, Int(I64)),
    (12, STATISTICS),
    (13, List(&PAGE_ENCODING_STATS)),
    (14, Int(I64)),
    (15, Int(I32)),
    (16, SIZE_STATISTICS),
    (17, GEOSPATIAL_STATISTICS),
]);

const COLUMN_CRYPTO_META_DATA: Shape =
    Struct(&[(1, EMPTY), (2, Struct(&[(1, List(&STRING)), (2, Binary)]))]);

const COLUMN_CHUNK: Shape = Struct(&[
    (1, STRING),
    (2, Int(I64)),
    (3, COLUMN_META_DATA),
    (4, Int(I64)),
    (5, Int(I32)),
    (6, Int(I64)),
    (7, Int(I32)),
    (8, COLUMN_CRYPTO_META_DATA),
    (9, Binary),
]);

const SORTING_COLUMN: Shape = Struct(&[(1, Int(I32)), (2, Bool), (3, Bool)]);

const ROW_GROUP: Shape = Struct(&[
    (1, List(&COLUMN_CHUNK)),
    (2, Int(I64)),
    (3, Int(I64)),
    (4, List(&SORTING_COLUMN)),
    (5, Int(I64)),
    (6, Int(I64)),
    (7, Int(I16)),
]);

const COLUMN_ORDER: Shape = Struct(&[(1, EMPTY), (2, EMPTY), (3, EMPTY)]);

const AES_GCM: Shape = Struct(&[(1, Binary), (2, Binary), (3, Bool)]);

const ENCRYPTION_ALGORITHM: Shape = Struct(&[(1, AES_GCM), (2, AES_GCM)]);

/// A Parquet footer's `FileMetaData`.
pub(super) const FILE_META_DATA: Shape = Struct(&[
    (1, Int(I32)),
    (2, List(&SCHEMA_ELEMENT)),
    (3, Int(I64)),
    (4, List(&ROW_GROUP)),
    (5, List(&KEY_VALUE)),
    (6, STRING),
    (7, List(&COLUMN_ORDER)),
    (8, ENCRYPTION_ALGORITHM),
    (9, Binary),
]);

/// A Parquet page's `PageHeader`.
pub(super) const PAGE_HEADER: Shape = Struct(&[
    (1, ENUM),
    (2, Int(I32)),
    (3, Int(I32)),
    (4, Int(I32)),
    (
        5,
        Struct(&[
            (1, Int(I32)),
            (2, ENUM),
            (3, ENUM),
            (4, ENUM),
            (5, STATISTICS),
        ]),
    ),
    (6, EMPTY),
    (7, Struct(&[(1, Int(I32)), (2, ENUM), (3, Bool)])),
    (
        8,
        Struct(&[
            (1, Int(I32)),
            (2, Int(I32)),
            (3, Int(I32)),
            (4, ENUM),
            (5, Int(I32)),
            (6, Int(I32)),
            (7, Bool),
            (8, STATISTICS),
        ]),
    ),
]);

impl Shape {
    /// The wire type a value of this shape is written as (a boolean field as `true`).
    fn wire_type(self) -> u8 {
        match self {
            Bool => BOOL_TRUE,
            Byte => BYTE,
            Int(ty) => ty,
            Double => DOUBLE,
            Binary => BINARY,
            List(_) => LIST,
            Struct(_) => STRUCT,
        }
    }

    /// Whether the wire type `ty` is this shape's.
    fn accepts(self, ty: u8) -> bool {
        match self {
            Bool => ty == BOOL_TRUE || ty == BOOL_FALSE,
            shape => shape.wire_type() == ty,
        }
    }
}

/// A wire type's name, for errors.
pub(super) fn type_name(ty: u8) -> String {
    let name = match ty {
        BOOL_TRUE | BOOL_FALSE => "bool",
        BYTE => "byte",
        I16 => "i16",
        I32 => "i32",
        I64 => "i64",
        DOUBLE => "double",
        BINARY => "binary",
        LIST => "list",
        STRUCT => "struct",
        other => return format!("type {other}"),
    };
    name.to_owned()
}

impl Thrift<'_> {
    /// Reads a value of `shape` whose wire type is `ty` (a field's type, or its list's
    /// element type), refusing what the `parquet` decoder would read otherwise (see the
    /// module docs).
    pub(super) fn walk(&mut self, shape: Shape, ty: u8, depth: usize) -> Result<(), String> {
        if depth > MAX_DEPTH {
            return Err("nested too deep".to_owned());
        }
        if !shape.accepts(ty) {
            return Err(format!(
                "a {} where the format has a {}",
                type_name(ty),
                type_name(shape.wire_type())
            ));
        }
        match shape {
            Struct(fields) => {
                let mut last = 0i16;
                while let Some((id, ty)) = self.field(&mut last)? {
                    match fields.iter().find(|(known, _)| *known == id) {
                        Some(&(_, shape)) => self
                            .walk(shape, ty, depth + 1)
                            .map_err(|e| format!("field {id}: {e}"))?,
                        None => self.skip(ty, depth + 1, true)?,
                    }
                }
                Ok(())
            }
            List(element) => {
                let (ty, n) = self.collection()?;
                for i in 0..n {
                    self.walk(*element, ty, depth + 1)
                        .map_err(|e| format!("element {i}: {e}"))?;
                }
                Ok(())
            }
            // A field's value, read as its type says (a bool field has none).
            scalar => self.skip(scalar.wire_type(), depth, true),
        }
    }
}
