//! Tables as Parquet: encoding (zstd), decoding and schema checks.

use arrow_array::{RecordBatch, RecordBatchReader};
use arrow_schema::SchemaRef;
use bytes::Bytes;
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::basic::{Compression, ZstdLevel};
use parquet::errors::ParquetError;
use parquet::file::properties::WriterProperties;

/// Encodes `batch` as one Parquet file, zstd-compressed.
pub fn encode_parquet(batch: &RecordBatch) -> Result<Bytes, ParquetError> {
    let properties = WriterProperties::builder().set_compression(Compression::ZSTD(ZstdLevel::default())).build();
    let mut buffer = Vec::new();
    let mut writer = ArrowWriter::try_new(&mut buffer, batch.schema(), Some(properties))?;
    writer.write(batch)?;
    writer.close()?;
    Ok(Bytes::from(buffer))
}

/// Decodes a Parquet file into one batch.
pub fn decode_parquet(bytes: Bytes) -> Result<RecordBatch, ParquetError> {
    let reader = ParquetRecordBatchReaderBuilder::try_new(bytes)?.build()?;
    let schema = reader.schema();
    let batches = reader.collect::<Result<Vec<_>, _>>()?;
    Ok(arrow_select::concat::concat_batches(&schema, &batches)?)
}

/// Whether `batch` has the columns `declared` says (names, types, nullability, in order).
pub(crate) fn matches_schema(batch: &RecordBatch, declared: &SchemaRef) -> bool {
    let actual = batch.schema();
    actual.fields().len() == declared.fields().len()
        && actual.fields().iter().zip(declared.fields().iter()).all(|(a, d)| {
            a.name() == d.name() && a.data_type() == d.data_type() && (d.is_nullable() || !a.is_nullable())
        })
}

/// A short description of a schema for error messages: `name: type, ...`.
pub(crate) fn describe_schema(schema: &SchemaRef) -> String {
    schema
        .fields()
        .iter()
        .map(|f| format!("{}: {}{}", f.name(), f.data_type(), if f.is_nullable() { "?" } else { "" }))
        .collect::<Vec<_>>()
        .join(", ")
}
