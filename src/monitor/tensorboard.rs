//! TensorBoard's event files, written as TensorFlow writes them, so `tensorboard --logdir`,
//! its Python reader and every tool that reads them (Weights & Biases' sync, the Neuron
//! profiler's viewer) take them.
//!
//! A file (`events.out.tfevents.<seconds>.<host>.<pid>`) is a sequence of records: the data's
//! length (8 bytes, little-endian), the masked CRC-32C of those 8 bytes, the data, the masked
//! CRC-32C of the data. Each record's data is an `Event` protocol buffer (`tensorflow/core/util/
//! event.proto`): the first says the file's version (`brain.Event:2`), the others carry a
//! `Summary` of scalar values (`simple_value`) for one step. The messages are encoded by
//! `prost` from the few fields below (the field numbers are event.proto's and summary.proto's);
//! the whole `.proto` files and a build-time compiler would add nothing.

use std::io::Write;
use std::path::{Path, PathBuf};

/// `tensorflow.Event`: the fields this writer sets (`what` is a oneof of `file_version` and
/// `summary`, so each event sets one of them; the encoding is the same).
#[derive(Clone, PartialEq, prost::Message)]
struct Event {
    #[prost(double, tag = "1")]
    wall_time: f64,
    #[prost(int64, tag = "2")]
    step: i64,
    #[prost(string, optional, tag = "3")]
    file_version: Option<String>,
    #[prost(message, optional, tag = "5")]
    summary: Option<Summary>,
}

/// `tensorflow.Summary`.
#[derive(Clone, PartialEq, prost::Message)]
struct Summary {
    #[prost(message, repeated, tag = "1")]
    value: Vec<SummaryValue>,
}

/// `tensorflow.Summary.Value`, a scalar (`simple_value`). The field is one of a oneof there,
/// so it is written even when it is 0 (a plain proto3 float at 0 is left out, and the reader
/// then sees no scalar at all).
#[derive(Clone, PartialEq, prost::Message)]
struct SummaryValue {
    #[prost(string, tag = "1")]
    tag: String,
    #[prost(float, optional, tag = "2")]
    simple_value: Option<f32>,
}

/// CRC-32C masked as TensorFlow's record format masks it.
fn masked_crc(bytes: &[u8]) -> u32 {
    let crc = crc32c::crc32c(bytes);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// One event file, appended to as scalars come.
pub(super) struct EventFile {
    file: std::io::BufWriter<std::fs::File>,
    path: PathBuf,
}

/// Seconds since the Unix epoch (an event's `wall_time`).
pub(super) fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

impl EventFile {
    /// A new event file in `dir` (created if needed).
    pub(super) fn create(dir: &Path) -> std::io::Result<EventFile> {
        std::fs::create_dir_all(dir)?;
        let host = neuron_pc_cache::hostname();
        let name = format!(
            "events.out.tfevents.{}.{host}.{}",
            now() as u64,
            std::process::id()
        );
        let path = dir.join(name);
        let file = std::fs::OpenOptions::new()
            .create_new(true)
            .write(true)
            .open(&path)?;
        let mut f = EventFile {
            file: std::io::BufWriter::new(file),
            path,
        };
        f.record(&Event {
            wall_time: now(),
            step: 0,
            file_version: Some("brain.Event:2".into()),
            summary: None,
        })?;
        f.file.flush()?;
        Ok(f)
    }

    /// The file's path.
    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    /// Appends the scalars of one step.
    pub(super) fn scalars(&mut self, step: u64, values: &[(&str, f64)]) -> std::io::Result<()> {
        let value = values
            .iter()
            .map(|(tag, v)| SummaryValue {
                tag: tag.to_string(),
                simple_value: Some(*v as f32),
            })
            .collect();
        self.record(&Event {
            wall_time: now(),
            step: i64::try_from(step).unwrap_or(i64::MAX),
            file_version: None,
            summary: Some(Summary { value }),
        })
    }

    fn record(&mut self, event: &Event) -> std::io::Result<()> {
        let data = prost::Message::encode_to_vec(event);
        let len = (data.len() as u64).to_le_bytes();
        self.file.write_all(&len)?;
        self.file.write_all(&masked_crc(&len).to_le_bytes())?;
        self.file.write_all(&data)?;
        self.file.write_all(&masked_crc(&data).to_le_bytes())
    }

    /// Writes what is buffered to the file.
    pub(super) fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_frame_their_events() {
        let dir = std::env::temp_dir().join(format!("npc-tb-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut f = EventFile::create(&dir).unwrap();
        f.scalars(7, &[("train/loss", 2.5)]).unwrap();
        f.flush().unwrap();
        let bytes = std::fs::read(f.path()).unwrap();
        let mut at = 0;
        let mut events = Vec::new();
        while at < bytes.len() {
            let len = u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap()) as usize;
            let crc = u32::from_le_bytes(bytes[at + 8..at + 12].try_into().unwrap());
            assert_eq!(crc, masked_crc(&bytes[at..at + 8]));
            let data = &bytes[at + 12..at + 12 + len];
            let crc = u32::from_le_bytes(bytes[at + 12 + len..at + 16 + len].try_into().unwrap());
            assert_eq!(crc, masked_crc(data));
            events.push(<Event as prost::Message>::decode(data).unwrap());
            at += 16 + len;
        }
        assert_eq!(events.len(), 2);
        assert_eq!(events[0].file_version.as_deref(), Some("brain.Event:2"));
        let s = events[1].summary.as_ref().unwrap();
        assert_eq!(events[1].step, 7);
        assert_eq!(
            (s.value[0].tag.as_str(), s.value[0].simple_value),
            ("train/loss", Some(2.5))
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
