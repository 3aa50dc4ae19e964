//! The dataset files users bring besides JSON lines and text: what Hugging Face
//! `datasets.Dataset.save_to_disk` writes (a directory of Arrow IPC streams named by its
//! `state.json`), Parquet files (`Dataset.to_parquet`, pandas, polars, a Hub repository's
//! `data/*.parquet`), and a directory of either.
//!
//! A document is a row's `text` column, or its `prompt` and `completion` columns (as in JSON
//! lines); other columns are not read. Strings may be Arrow's `string` or `large_string`.

use std::path::{Path, PathBuf};

use arrow_array::cast::AsArray;
use arrow_array::{Array, OffsetSizeTrait, RecordBatch};
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::record::Field;
use parquet::schema::types::Type;

use super::Document;
use crate::error::{Error, Result};

/// Which columns make a document.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Columns {
    Text,
    Pair,
}

impl Columns {
    fn names(self) -> &'static [&'static str] {
        match self {
            Columns::Text => &["text"],
            Columns::Pair => &["prompt", "completion"],
        }
    }

    /// The columns of a file with these column names, or the error naming them.
    fn of(path: &Path, names: &[&str]) -> Result<Columns> {
        if names.contains(&"text") {
            Ok(Columns::Text)
        } else if names.contains(&"prompt") && names.contains(&"completion") {
            Ok(Columns::Pair)
        } else {
            Err(Error::Config(format!(
                "{}: expected a \"text\" column, or \"prompt\" and \"completion\" (it has: {})",
                path.display(),
                names.join(", ")
            )))
        }
    }

    /// The document of one row's values (in [`Columns::names`] order).
    fn document(self, mut values: Vec<String>) -> Document {
        match self {
            Columns::Text => Document::Text(values.remove(0)),
            Columns::Pair => {
                let completion = values.pop().unwrap_or_default();
                let prompt = values.pop().unwrap_or_default();
                Document::Pair { prompt, completion }
            }
        }
    }
}

/// Whether [`read`] reads `path` (rather than JSON lines or text).
pub(super) fn is_dataset(path: &Path) -> bool {
    path.is_dir() || matches!(extension(path), Some("arrow" | "parquet"))
}

fn extension(path: &Path) -> Option<&str> {
    path.extension().and_then(|e| e.to_str())
}

/// The documents of a `save_to_disk` directory, an `.arrow` stream, a `.parquet` file, or a
/// directory of `.parquet`/`.arrow` files (read in name order, as `datasets` orders a Hub
/// repository's shards).
pub(super) fn read(path: &Path) -> Result<Vec<Document>> {
    if !path.is_dir() {
        return read_file(path);
    }
    let mut docs = Vec::new();
    for file in data_files(path)? {
        docs.extend(read_file(&file)?);
    }
    Ok(docs)
}

fn read_file(path: &Path) -> Result<Vec<Document>> {
    match extension(path) {
        Some("parquet") => read_parquet(path),
        _ => read_arrow(path),
    }
}

/// A directory's data files: those its `state.json` lists (`save_to_disk`), else its
/// `.parquet` or `.arrow` files, searched down to its `data/` directory as on the Hub.
fn data_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let cannot = |what: &Path, e: &dyn std::fmt::Display| {
        Error::Config(format!("{}: cannot read: {e}", what.display()))
    };
    let state = dir.join("state.json");
    if state.is_file() {
        let text = std::fs::read_to_string(&state).map_err(|e| cannot(&state, &e))?;
        let value: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| cannot(&state, &e))?;
        let files = value["_data_files"]
            .as_array()
            .map(|files| {
                files
                    .iter()
                    .filter_map(|f| f["filename"].as_str().map(|n| dir.join(n)))
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default();
        if files.is_empty() {
            return Err(Error::Config(format!(
                "{}: no \"_data_files\" (is this a `datasets.save_to_disk` directory?)",
                state.display()
            )));
        }
        return Ok(files);
    }
    let splits = dir.join("dataset_dict.json");
    if splits.is_file() {
        let text = std::fs::read_to_string(&splits).unwrap_or_default();
        let names: Vec<String> = serde_json::from_str::<serde_json::Value>(&text)
            .ok()
            .and_then(|v| v["splits"].as_array().cloned())
            .unwrap_or_default()
            .iter()
            .filter_map(|s| s.as_str().map(str::to_string))
            .collect();
        return Err(Error::Config(format!(
            "{}: a DatasetDict of splits ({}): name one split's directory, e.g. {}",
            dir.display(),
            names.join(", "),
            dir.join(names.first().map_or("train", String::as_str))
                .display()
        )));
    }
    let mut files = Vec::new();
    for d in [dir.to_path_buf(), dir.join("data")] {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries {
            let p = entry.map_err(|e| cannot(&d, &e))?.path();
            if p.is_file() && matches!(extension(&p), Some("parquet" | "arrow")) {
                files.push(p);
            }
        }
        if !files.is_empty() {
            break;
        }
    }
    if files.is_empty() {
        return Err(Error::Config(format!(
            "{}: a directory without state.json (`datasets.save_to_disk`) or .parquet/.arrow \
             files",
            dir.display()
        )));
    }
    files.sort();
    Ok(files)
}

/// An Arrow IPC stream (what `save_to_disk` writes), or an Arrow IPC file (`ARROW1` magic).
fn read_arrow(path: &Path) -> Result<Vec<Document>> {
    let bad = |e: &dyn std::fmt::Display| Error::Config(format!("{}: {e}", path.display()));
    use std::io::{Read, Seek};
    let mut file = std::fs::File::open(path).map_err(|e| bad(&format!("cannot read: {e}")))?;
    let mut magic = [0u8; 6];
    let is_file_format = file.read_exact(&mut magic).is_ok() && &magic == b"ARROW1";
    file.rewind()
        .map_err(|e| bad(&format!("cannot read: {e}")))?;
    let batches: Box<dyn Iterator<Item = std::result::Result<RecordBatch, _>>> = if is_file_format {
        Box::new(
            arrow_ipc::reader::FileReader::try_new_buffered(file, None)
                .map_err(|e| bad(&format!("not an Arrow IPC file: {e}")))?,
        )
    } else {
        Box::new(
            arrow_ipc::reader::StreamReader::try_new_buffered(file, None)
                .map_err(|e| bad(&format!("not an Arrow IPC stream: {e}")))?,
        )
    };
    let mut docs = Vec::new();
    let mut row = 0;
    for batch in batches {
        let batch = batch.map_err(|e| bad(&e))?;
        let schema = batch.schema();
        let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
        let columns = Columns::of(path, &names)?;
        let arrays = columns
            .names()
            .iter()
            .map(|name| {
                let array = batch.column_by_name(name).expect("checked above");
                strings(array.as_ref()).ok_or_else(|| {
                    bad(&format!(
                        "column \"{name}\" is {}, not a string",
                        array.data_type()
                    ))
                })
            })
            .collect::<Result<Vec<_>>>()?;
        for i in 0..batch.num_rows() {
            let values = columns
                .names()
                .iter()
                .zip(&arrays)
                .map(|(name, column)| {
                    column(i).ok_or_else(|| bad(&format!("row {}: \"{name}\" is null", row + i)))
                })
                .collect::<Result<Vec<_>>>()?;
            docs.push(columns.document(values));
        }
        row += batch.num_rows();
    }
    Ok(docs)
}

/// Row `i` of a `string` or `large_string` column (`None` for a null); `None` for another type.
type StringColumn<'a> = Box<dyn Fn(usize) -> Option<String> + 'a>;

fn strings(array: &dyn Array) -> Option<StringColumn<'_>> {
    fn of<O: OffsetSizeTrait>(array: &dyn Array) -> Option<StringColumn<'_>> {
        let a = array.as_string_opt::<O>()?;
        Some(Box::new(move |i| {
            (!a.is_null(i)).then(|| a.value(i).to_string())
        }))
    }
    of::<i32>(array).or_else(|| of::<i64>(array))
}

/// A Parquet file, through Parquet's row reader (only the document's columns are decoded).
fn read_parquet(path: &Path) -> Result<Vec<Document>> {
    let bad = |e: &dyn std::fmt::Display| Error::Config(format!("{}: {e}", path.display()));
    let file = std::fs::File::open(path).map_err(|e| bad(&format!("cannot read: {e}")))?;
    let reader =
        SerializedFileReader::new(file).map_err(|e| bad(&format!("not a Parquet file: {e}")))?;
    let schema = reader.metadata().file_metadata().schema();
    let fields = schema.get_fields();
    let names: Vec<&str> = fields.iter().map(|f| f.name()).collect();
    let columns = Columns::of(path, &names)?;
    let projection = Type::group_type_builder(schema.name())
        .with_fields(
            fields
                .iter()
                .filter(|f| columns.names().contains(&f.name()))
                .cloned()
                .collect(),
        )
        .build()
        .map_err(|e| bad(&e))?;
    // A codec this build leaves out: say which ones it reads, and what to do.
    let codec = |e: parquet::errors::ParquetError| match e.to_string() {
        m if m.contains("Disabled feature at compile time") => bad(&format!(
            "compressed with {}, which neuron-pc does not read (snappy and zstd, the defaults of \
             pyarrow and polars, it does): rewrite it, e.g. \
             pyarrow.parquet.write_table(table, path, compression=\"zstd\")",
            match m.rsplit(": ").next() {
                Some("flate2") => "gzip",
                Some(feature) => feature,
                None => "a codec",
            }
        )),
        m => bad(&m),
    };
    let rows = reader.get_row_iter(Some(projection)).map_err(codec)?;
    let mut docs = Vec::new();
    for (n, row) in rows.enumerate() {
        let row = row.map_err(codec)?;
        let mut values = Vec::with_capacity(2);
        for name in columns.names() {
            let field = row
                .get_column_iter()
                .find(|(column, _)| column.as_str() == *name)
                .map(|(_, field)| field);
            match field {
                Some(Field::Str(s)) => values.push(s.clone()),
                Some(Field::Null) | None => {
                    return Err(bad(&format!("row {n}: \"{name}\" is null")))
                }
                Some(other) => {
                    return Err(bad(&format!(
                        "row {n}: \"{name}\" is not a string: {other}"
                    )))
                }
            }
        }
        docs.push(columns.document(values));
    }
    Ok(docs)
}
