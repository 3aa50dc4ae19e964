//! The training data of `train_llama`: the synthetic reversal task, the bytes of a file, or
//! rows of tokens (packed documents or a pre-tokenized shard).

use std::sync::Arc;

use neuron_pc::data::{PackedRows, TokenShard};
use neuron_pc::nn::{HostRng, IGNORE_INDEX};
use neuron_pc::HostTensor;

/// Where the training sequences come from; batch `i` is a pure function of `(seed, i)`, so a
/// resumed run sees the same data.
#[derive(Clone)]
pub enum Task {
    /// `[0, a_1 .. a_k, 1, a_k .. a_1]`: the model learns to reverse; only the reversed half
    /// is scored (the rest of the labels are -100).
    Reverse { alphabet: usize },
    /// Windows of a byte string; every next byte is scored.
    Bytes(std::sync::Arc<[u8]>),
    /// Packed rows of tokenized documents, batch `i` the rows from `i * batch` on (wrapping):
    /// `[input_ids, position_ids, labels]`.
    Packed(Arc<PackedRows>),
    /// Rows of a pre-tokenized llm.c shard (`--data x.bin`), as `Packed`.
    Shard(Arc<TokenShard>),
}

impl Task {
    /// Rows of random lengths up to `seq` (reversal: `2k + 2` tokens for a random `k`; bytes: a
    /// random window), each with its labels, for length buckets.
    pub fn ragged_rows(
        &self,
        seed: u64,
        index: u64,
        batch: usize,
        seq: usize,
    ) -> Vec<(Vec<i32>, Vec<i32>)> {
        let mut rng = HostRng::new(seed.wrapping_mul(0x9E37_79B9).wrapping_add(index) ^ 0x5bd1);
        (0..batch)
            .map(|_| match self {
                Task::Reverse { alphabet } => {
                    let k = 1 + (rng.next_u64() % (seq / 2 - 1) as u64) as usize;
                    let a: Vec<i32> = (0..k)
                        .map(|_| 2 + (rng.next_u64() % *alphabet as u64) as i32)
                        .collect();
                    let ids: Vec<i32> = std::iter::once(0)
                        .chain(a.iter().copied())
                        .chain(std::iter::once(1))
                        .chain(a.iter().rev().copied())
                        .collect();
                    let labels = (0..ids.len())
                        .map(|t| {
                            if t >= k + 2 {
                                ids[t]
                            } else {
                                IGNORE_INDEX as i32
                            }
                        })
                        .collect();
                    (ids, labels)
                }
                // --data conflicts with --buckets
                Task::Packed(_) | Task::Shard(_) => unreachable!("--data conflicts with --buckets"),
                Task::Bytes(bytes) => {
                    let len = 2 + (rng.next_u64() % (seq - 1) as u64) as usize;
                    let start = (rng.next_u64() % (bytes.len() - len + 1) as u64) as usize;
                    let ids: Vec<i32> = bytes[start..start + len]
                        .iter()
                        .map(|b| i32::from(*b))
                        .collect();
                    (ids.clone(), ids)
                }
            })
            .collect()
    }

    /// Rows `start..start + n` of the stream (wrapping) of a packed or shard task, built from
    /// those rows alone: a process of a multi-process run reads only its share.
    pub fn rows(&self, start: usize, n: usize, seq: usize) -> Option<Vec<HostTensor>> {
        match self {
            Task::Packed(rows) => Some(rows.batch(start, n)),
            Task::Shard(shard) => Some(
                shard
                    .batch(start, n, seq)
                    .expect("checked at start: the shard holds a row"),
            ),
            _ => None,
        }
    }

    /// `input_ids` and `labels`, int32 `[batch, seq]` (and the position ids between them for
    /// packed rows).
    pub fn batch(&self, seed: u64, index: u64, batch: usize, seq: usize) -> Vec<HostTensor> {
        if let Some(rows) = self.rows(index as usize * batch, batch, seq) {
            return rows;
        }
        let mut rng = HostRng::new(seed.wrapping_mul(0x9E37_79B9).wrapping_add(index));
        let mut ids = Vec::with_capacity(batch * seq);
        let mut labels = Vec::with_capacity(batch * seq);
        for _ in 0..batch {
            match self {
                Task::Reverse { alphabet } => {
                    let k = seq / 2 - 1;
                    let a: Vec<i32> = (0..k)
                        .map(|_| 2 + (rng.next_u64() % *alphabet as u64) as i32)
                        .collect();
                    let row: Vec<i32> = std::iter::once(0)
                        .chain(a.iter().copied())
                        .chain(std::iter::once(1))
                        .chain(a.iter().rev().copied())
                        .chain(std::iter::repeat(0))
                        .take(seq)
                        .collect();
                    for (t, &tok) in row.iter().enumerate() {
                        let scored = t >= k + 2 && t < 2 * k + 2;
                        labels.push(if scored { tok } else { IGNORE_INDEX as i32 });
                    }
                    ids.extend(row);
                }
                Task::Packed(_) | Task::Shard(_) => unreachable!("returned above"),
                Task::Bytes(bytes) => {
                    let start = (rng.next_u64() % (bytes.len() - seq + 1) as u64) as usize;
                    let row = bytes[start..start + seq].iter().map(|b| i32::from(*b));
                    ids.extend(row.clone());
                    labels.extend(row);
                }
            }
        }
        vec![
            HostTensor::from_slice(&ids, &[batch, seq]).expect("sizes agree"),
            HostTensor::from_slice(&labels, &[batch, seq]).expect("sizes agree"),
        ]
    }
}

/// Rows `start..start + n` of a batch tensor (first dimension).
pub fn rows(t: &HostTensor, start: usize, n: usize) -> HostTensor {
    let row = t.bytes().len() / t.dims()[0];
    let mut dims = t.dims().to_vec();
    dims[0] = n;
    HostTensor::from_bytes(
        t.dtype(),
        &dims,
        t.bytes()[start * row..(start + n) * row].to_vec(),
    )
    .expect("a slice of rows has the row size")
}

/// What the batch's rows are split over, of `replicas` in the whole run: the replicas, or a
/// mesh's data and expert axes (in each process, the processes its replicas).
pub fn batch_split(mesh: bool, (fsdp, ep): (usize, usize), replicas: usize) -> (usize, String) {
    // the expert axis is data parallel outside the experts: the batch is split over it too
    let axes = match ep {
        1 => format!("--fsdp {fsdp}"),
        _ => format!("--fsdp {fsdp} x --ep {ep}"),
    };
    if mesh && replicas > 1 {
        (
            fsdp * ep * replicas,
            format!("{axes} x {replicas} processes"),
        )
    } else if mesh {
        (fsdp * ep, axes)
    } else {
        (replicas, format!("{replicas} replica(s)"))
    }
}
