//! `sesa tables`: the tables the stages of specs write, with their columns, as a Markdown
//! table. docs/analysis.md's list of columns is this command's output (a test keeps it so).

use std::collections::{BTreeMap, BTreeSet};

use arrow_schema::{DataType, SchemaRef};
use sesa_engine::Pipeline;

/// A table, the stage kinds that write it, and its columns.
struct TableEntry {
    writers: BTreeSet<String>,
    schema: SchemaRef,
}

/// The Markdown table of every table the stages of `pipelines` write.
pub fn markdown(pipelines: &[Pipeline]) -> String {
    let mut tables: BTreeMap<String, TableEntry> = BTreeMap::new();
    let mut kinds = BTreeSet::new();
    for pipeline in pipelines {
        for (index, stage) in pipeline.spec().stages.iter().enumerate() {
            kinds.insert(stage.kind.clone());
            for table in pipeline.outputs(index) {
                tables
                    .entry(table.name.clone())
                    .or_insert_with(|| TableEntry { writers: BTreeSet::new(), schema: table.schema.clone() })
                    .writers
                    .insert(stage.kind.clone());
            }
        }
    }
    let mut out = String::from("| table | written by | columns |\n|---|---|---|\n");
    for (name, entry) in &tables {
        let writers = if entry.writers.len() > 1 && entry.writers == kinds {
            "every stage".to_string()
        } else {
            entry.writers.iter().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(", ")
        };
        let columns: Vec<String> =
            entry.schema.fields().iter().map(|f| format!("`{}` {}", f.name(), type_name(f.data_type()))).collect();
        out.push_str(&format!("| `{name}` | {writers} | {} |\n", columns.join(", ")));
    }
    out
}

/// A column type as a query writer thinks of it.
fn type_name(data_type: &DataType) -> String {
    match data_type {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => "string".into(),
        DataType::Boolean => "bool".into(),
        DataType::UInt8 => "u8".into(),
        DataType::UInt32 => "u32".into(),
        DataType::UInt64 => "u64".into(),
        DataType::Int32 => "i32".into(),
        DataType::Int64 => "i64".into(),
        DataType::Float32 => "f32".into(),
        DataType::Float64 => "f64".into(),
        DataType::Binary | DataType::LargeBinary => "bytes".into(),
        DataType::List(item) | DataType::LargeList(item) => format!("list<{}>", type_name(item.data_type())),
        other => other.to_string().to_lowercase(),
    }
}
