//! Building and reading Arrow tables: a table is defined once, by the function that builds it
//! from rows, and a stage declares its schema by building it from no rows. Generic over what the
//! rows mean, so every crate that writes or reads a run's tables shares one set of helpers.

use std::sync::Arc;

use crate::StageError;
use arrow_array::builder::{BooleanBuilder, ListBuilder, PrimitiveBuilder, StringBuilder};
use arrow_array::types::{ArrowPrimitiveType, Float32Type, UInt32Type};
use arrow_array::{
    Array, ArrayRef, BooleanArray, Float64Array, LargeBinaryArray, ListArray, PrimitiveArray, RecordBatch, StringArray,
    UInt64Array,
};
use arrow_schema::{ArrowError, DataType, Field, Schema, SchemaRef};

/// Columns added one by one, each with its name and type.
#[derive(Default)]
pub struct Columns {
    fields: Vec<Field>,
    arrays: Vec<ArrayRef>,
}

fn item(data_type: DataType) -> DataType {
    DataType::List(Arc::new(Field::new("item", data_type, true)))
}

impl Columns {
    fn push(mut self, name: &str, array: ArrayRef, nullable: bool) -> Self {
        self.fields.push(Field::new(name, array.data_type().clone(), nullable));
        self.arrays.push(array);
        self
    }

    /// Unsigned integers.
    pub fn u64(self, name: &str, values: impl IntoIterator<Item = u64>) -> Self {
        self.push(name, Arc::new(UInt64Array::from_iter_values(values)), false)
    }

    /// Unsigned integers that may be absent.
    pub fn opt_u64(self, name: &str, values: impl IntoIterator<Item = Option<u64>>) -> Self {
        self.push(name, Arc::new(UInt64Array::from_iter(values)), true)
    }

    /// Floats.
    pub fn f64(self, name: &str, values: impl IntoIterator<Item = f64>) -> Self {
        self.push(name, Arc::new(Float64Array::from_iter_values(values)), false)
    }

    /// Floats that may be absent.
    pub fn opt_f64(self, name: &str, values: impl IntoIterator<Item = Option<f64>>) -> Self {
        self.push(name, Arc::new(Float64Array::from_iter(values)), true)
    }

    /// Booleans.
    pub fn bool(self, name: &str, values: impl IntoIterator<Item = bool>) -> Self {
        let mut builder = BooleanBuilder::new();
        values.into_iter().for_each(|v| builder.append_value(v));
        self.push(name, Arc::new(builder.finish()), false)
    }

    /// Booleans, some absent.
    pub fn opt_bool(self, name: &str, values: impl IntoIterator<Item = Option<bool>>) -> Self {
        self.push(name, Arc::new(BooleanArray::from_iter(values)), true)
    }

    /// Text.
    pub fn str<'a>(self, name: &str, values: impl IntoIterator<Item = &'a str>) -> Self {
        self.push(name, Arc::new(StringArray::from_iter_values(values)), false)
    }

    /// Text that may be absent.
    pub fn opt_str<'a>(self, name: &str, values: impl IntoIterator<Item = Option<&'a str>>) -> Self {
        self.push(name, Arc::new(StringArray::from_iter(values)), true)
    }

    /// Lists of text.
    pub fn strs<'a, L: IntoIterator<Item = &'a str>>(self, name: &str, values: impl IntoIterator<Item = L>) -> Self {
        let mut builder = ListBuilder::new(StringBuilder::new());
        for list in values {
            list.into_iter().for_each(|v| builder.values().append_value(v));
            builder.append(true);
        }
        let array = builder.finish();
        debug_assert_eq!(array.data_type(), &item(DataType::Utf8));
        self.push(name, Arc::new(array), false)
    }

    /// Lists of token ids.
    pub fn u32s<'a>(self, name: &str, values: impl IntoIterator<Item = &'a [u32]>) -> Self {
        self.lists::<UInt32Type>(name, values)
    }

    /// Lists of floats.
    pub fn f32s<'a>(self, name: &str, values: impl IntoIterator<Item = &'a [f32]>) -> Self {
        self.lists::<Float32Type>(name, values)
    }

    fn lists<'a, T: ArrowPrimitiveType>(self, name: &str, values: impl IntoIterator<Item = &'a [T::Native]>) -> Self {
        let mut builder = ListBuilder::new(PrimitiveBuilder::<T>::new());
        for list in values {
            builder.values().append_slice(list);
            builder.append(true);
        }
        self.push(name, Arc::new(builder.finish()), false)
    }

    /// Raw bytes, already in an array (large tensors: built once, never copied again).
    pub fn bytes(self, name: &str, values: LargeBinaryArray) -> Self {
        self.push(name, Arc::new(values), false)
    }

    /// The batch.
    pub fn finish(self) -> Result<RecordBatch, ArrowError> {
        RecordBatch::try_new(Arc::new(Schema::new(self.fields)), self.arrays)
    }
}

/// The schema of a table builder, from a batch of no rows.
pub fn schema_of(build: impl FnOnce() -> Result<RecordBatch, ArrowError>) -> SchemaRef {
    build().expect("an empty table builds").schema()
}

/// Typed access to the columns of an input table, with errors that name the column.
pub struct Reader<'a> {
    table: &'a str,
    batch: &'a RecordBatch,
}

impl<'a> Reader<'a> {
    /// Reads `batch`, the table `table`.
    pub fn new(table: &'a str, batch: &'a RecordBatch) -> Self {
        Reader { table, batch }
    }

    /// Rows.
    pub fn rows(&self) -> usize {
        self.batch.num_rows()
    }

    fn column<T: 'static>(&self, name: &str) -> Result<&'a T, StageError> {
        self.batch.column_by_name(name).and_then(|c| c.as_any().downcast_ref::<T>()).ok_or_else(|| {
            StageError::Failed(format!("table `{}`: column `{name}` is missing or has another type", self.table))
        })
    }

    /// A u64 column.
    pub fn u64(&self, name: &str) -> Result<Vec<u64>, StageError> {
        Ok(self.column::<UInt64Array>(name)?.values().to_vec())
    }

    /// A u64 column that may hold absent values.
    pub fn opt_u64(&self, name: &str) -> Result<Vec<Option<u64>>, StageError> {
        Ok(self.column::<UInt64Array>(name)?.iter().collect())
    }

    /// A f64 column.
    pub fn f64(&self, name: &str) -> Result<Vec<f64>, StageError> {
        Ok(self.column::<Float64Array>(name)?.values().to_vec())
    }

    /// A f64 column that may hold absent values.
    pub fn opt_f64(&self, name: &str) -> Result<Vec<Option<f64>>, StageError> {
        Ok(self.column::<Float64Array>(name)?.iter().collect())
    }

    /// A boolean column.
    pub fn bool(&self, name: &str) -> Result<Vec<bool>, StageError> {
        Ok(self.column::<BooleanArray>(name)?.iter().map(|v| v.unwrap_or(false)).collect())
    }

    /// A text column (absent values as empty text).
    pub fn str(&self, name: &str) -> Result<Vec<&'a str>, StageError> {
        Ok(self.column::<StringArray>(name)?.iter().map(|v| v.unwrap_or_default()).collect())
    }

    /// A text column that may hold absent values.
    pub fn opt_str(&self, name: &str) -> Result<Vec<Option<&'a str>>, StageError> {
        Ok(self.column::<StringArray>(name)?.iter().collect())
    }

    /// A list-of-token-ids column.
    pub fn u32s(&self, name: &str) -> Result<Vec<Vec<u32>>, StageError> {
        self.lists::<UInt32Type>(name)
    }

    /// A list-of-f32 column (per-token log-probabilities).
    pub fn f32s(&self, name: &str) -> Result<Vec<Vec<f32>>, StageError> {
        self.lists::<arrow_array::types::Float32Type>(name)
    }

    fn lists<T: ArrowPrimitiveType>(&self, name: &str) -> Result<Vec<Vec<T::Native>>, StageError> {
        let lists = self.column::<ListArray>(name)?;
        (0..lists.len())
            .map(|row| {
                let values = lists.value(row);
                let values = values.as_any().downcast_ref::<PrimitiveArray<T>>().ok_or_else(|| {
                    StageError::Failed(format!("table `{}`: column `{name}` is a list of another type", self.table))
                })?;
                Ok(values.values().to_vec())
            })
            .collect()
    }

    /// A raw-bytes column, shared with the batch (not copied).
    pub fn bytes(&self, name: &str) -> Result<LargeBinaryArray, StageError> {
        Ok(self.column::<LargeBinaryArray>(name)?.clone())
    }

    /// A list-of-text column.
    pub fn strs(&self, name: &str) -> Result<Vec<Vec<String>>, StageError> {
        let lists = self.column::<ListArray>(name)?;
        (0..lists.len())
            .map(|row| {
                let values = lists.value(row);
                let values = values.as_any().downcast_ref::<StringArray>().ok_or_else(|| {
                    StageError::Failed(format!("table `{}`: column `{name}` is not a list of text", self.table))
                })?;
                Ok(values.iter().map(|v| v.unwrap_or_default().to_string()).collect())
            })
            .collect()
    }
}
