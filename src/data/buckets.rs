//! Sequence-length buckets for variable-length token data: each batch is padded to the
//! smallest bucket that holds its longest sequence, so a stream of any lengths compiles at most
//! one step graph per bucket, not one per length (the first cause of recompiles in LLM runs on
//! XLA: PyTorch/XLA users pad to a few lengths by hand).
//!
//! A padded batch is `[input_ids, attention_mask, labels]`, each `i32 [rows, bucket]`: the ids
//! padded with the pad id, the mask 1 on real tokens and 0 on padding, the labels the ids with
//! padding set to -100 (what [`crate::nn::cross_entropy`] ignores, as `transformers`' collators
//! do). In a trial run (`neuron-pc compile`), the stream first yields one batch of every bucket,
//! so the trial traces every bucket's graph and the real run compiles nothing.

use neuron_pc_compiler::HostTensor;

use crate::error::{Error, Result};
use crate::nn::IGNORE_INDEX;

/// The sequence lengths a batch may be padded to, ascending.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LengthBuckets {
    lengths: Vec<usize>,
}

impl LengthBuckets {
    /// Buckets of the given lengths (any order; duplicates merged; none may be 0).
    pub fn new(lengths: impl IntoIterator<Item = usize>) -> Result<LengthBuckets> {
        let mut lengths: Vec<usize> = lengths.into_iter().collect();
        lengths.sort_unstable();
        lengths.dedup();
        if lengths.is_empty() || lengths[0] == 0 {
            return Err(Error::Config(format!(
                "length buckets {lengths:?}: give at least one length, each at least 1"
            )));
        }
        Ok(LengthBuckets { lengths })
    }

    /// `step, 2 step, ...` up to `max`, and `max` itself (multiples of 64 up to 512: 8 buckets).
    pub fn multiples(step: usize, max: usize) -> Result<LengthBuckets> {
        if step == 0 || max == 0 {
            return Err(Error::Config(format!(
                "length buckets: multiples of {step} up to {max} need both at least 1"
            )));
        }
        LengthBuckets::new((1..=max / step).map(|k| k * step).chain([max]))
    }

    /// Parses `16,32,64` (a list of lengths) or `64..512` (multiples of 64 up to 512).
    pub fn parse(text: &str) -> Result<LengthBuckets> {
        let bad = |why: &str| {
            Error::Config(format!(
                "length buckets {text:?}: {why} (write 16,32,64 or STEP..MAX such as 64..512)"
            ))
        };
        let number = |s: &str| s.trim().parse::<usize>().map_err(|_| bad("not a number"));
        match text.split_once("..") {
            Some((step, max)) => LengthBuckets::multiples(number(step)?, number(max)?),
            None => LengthBuckets::new(text.split(',').map(number).collect::<Result<Vec<_>>>()?),
        }
    }

    /// The lengths, ascending.
    pub fn lengths(&self) -> &[usize] {
        &self.lengths
    }

    /// The largest bucket: the longest sequence a batch may hold.
    pub fn max(&self) -> usize {
        self.lengths[self.lengths.len() - 1]
    }

    /// The smallest bucket holding `len` tokens; `None` past the largest.
    pub fn bucket_for(&self, len: usize) -> Option<usize> {
        let i = self.lengths.partition_point(|&b| b < len);
        self.lengths.get(i).copied()
    }

    /// Pads `sequences` (one row each: token ids, or ids with their own labels, see
    /// [`TokenRow`]) to the smallest bucket holding the longest of them. A sequence longer than
    /// the largest bucket is an error naming it (truncate the data or add a bucket): cutting
    /// tokens silently would change what the model learns.
    pub fn pad<R: TokenRow>(&self, sequences: &[R], pad_id: i32) -> Result<PaddedTokens> {
        let longest = sequences.iter().map(|s| s.ids().len()).max().unwrap_or(0);
        if let Some((row, s)) = sequences
            .iter()
            .enumerate()
            .find(|(_, s)| s.labels().is_some_and(|l| l.len() != s.ids().len()))
        {
            return Err(Error::Config(format!(
                "sequence {row} of the batch has {} tokens but {} labels",
                s.ids().len(),
                s.labels().map_or(0, <[i32]>::len)
            )));
        }
        let Some(length) = self.bucket_for(longest) else {
            let (row, _) = sequences
                .iter()
                .enumerate()
                .find(|(_, s)| s.ids().len() == longest)
                .expect("the longest exists");
            return Err(Error::Config(format!(
                "sequence {row} of the batch has {longest} tokens, more than the largest length \
                 bucket ({}): truncate the data or add a bucket",
                self.max()
            )));
        };
        Ok(pad_rows(sequences, length, pad_id))
    }

    /// Padded host batches from a stream of token batches (each a list of sequences), for
    /// [`super::DeviceLoader::for_tokens`]. In a trial run the stream starts with
    /// one batch of `rows` sequences of every bucket length, so the trial run traces each
    /// bucket's graphs; give it at least as many steps as there are buckets.
    pub fn batches<I, R>(&self, stream: I, rows: usize, pad_id: i32) -> BucketedBatches<I::IntoIter>
    where
        I: IntoIterator<Item = Vec<R>>,
        R: TokenRow,
    {
        BucketedBatches {
            buckets: self.clone(),
            stream: stream.into_iter(),
            sweep: None,
            micro_batches: 1,
            rows,
            pad_id,
        }
    }
}

/// A batch of token sequences padded to one length.
#[derive(Clone, Debug, PartialEq)]
pub struct PaddedTokens {
    /// `i32 [rows, length]`, padding holds the pad id.
    pub input_ids: HostTensor,
    /// `i32 [rows, length]`: 1 on real tokens, 0 on padding.
    pub attention_mask: HostTensor,
    /// `i32 [rows, length]`: the ids, -100 on padding (ignored by `cross_entropy`).
    pub labels: HostTensor,
    /// Real tokens in the batch (padding excluded).
    pub tokens: usize,
    /// The bucket length every row was padded to.
    pub length: usize,
}

impl PaddedTokens {
    /// The batch grown to `rows` rows with rows of no tokens (ids 0, mask 0, labels -100).
    pub fn with_rows(self, rows: usize) -> PaddedTokens {
        let have = self.input_ids.dims()[0];
        if rows <= have {
            return self;
        }
        let grow = |t: &HostTensor, fill: i32| {
            let mut v = t.to_vec::<i32>().expect("token tensors are i32");
            v.resize(rows * self.length, fill);
            HostTensor::from_slice(&v, &[rows, self.length]).expect("sizes match")
        };
        PaddedTokens {
            input_ids: grow(&self.input_ids, 0),
            attention_mask: grow(&self.attention_mask, 0),
            labels: grow(&self.labels, IGNORE_INDEX as i32),
            ..self
        }
    }

    /// `[input_ids, attention_mask, labels]`, as [`super::DeviceLoader`] takes a batch.
    pub fn into_tensors(self) -> Vec<HostTensor> {
        vec![self.input_ids, self.attention_mask, self.labels]
    }
}

/// One sequence of a token batch: its ids, and optionally labels of its own (the same length;
/// -100 where a token is not scored, such as a prompt). Without labels, every token is scored.
pub trait TokenRow {
    /// The sequence's token ids.
    fn ids(&self) -> &[i32];
    /// Its labels, one per id, or `None` to score every token (the labels are then the ids).
    fn labels(&self) -> Option<&[i32]>;
}

impl TokenRow for Vec<i32> {
    fn ids(&self) -> &[i32] {
        self
    }
    fn labels(&self) -> Option<&[i32]> {
        None
    }
}

/// `(ids, labels)`.
impl TokenRow for (Vec<i32>, Vec<i32>) {
    fn ids(&self) -> &[i32] {
        &self.0
    }
    fn labels(&self) -> Option<&[i32]> {
        Some(&self.1)
    }
}

fn pad_rows<R: TokenRow>(sequences: &[R], length: usize, pad_id: i32) -> PaddedTokens {
    let rows = sequences.len();
    let mut ids = vec![pad_id; rows * length];
    let mut mask = vec![0i32; rows * length];
    let mut labels = vec![IGNORE_INDEX as i32; rows * length];
    let mut tokens = 0;
    for (r, s) in sequences.iter().enumerate() {
        let at = r * length;
        let n = s.ids().len();
        ids[at..at + n].copy_from_slice(s.ids());
        labels[at..at + n].copy_from_slice(s.labels().unwrap_or(s.ids()));
        mask[at..at + n].fill(1);
        tokens += n;
    }
    let t = |v: &[i32]| HostTensor::from_slice(v, &[rows, length]).expect("sizes match");
    PaddedTokens {
        input_ids: t(&ids),
        attention_mask: t(&mask),
        labels: t(&labels),
        tokens,
        length,
    }
}

/// The iterator of [`LengthBuckets::batches`]: `Ok([input_ids, attention_mask, labels])` per
/// batch, or the error of a sequence longer than the largest bucket.
pub struct BucketedBatches<I> {
    buckets: LengthBuckets,
    stream: I,
    /// The trial run's bucket lengths still to visit (made at the first batch).
    sweep: Option<std::vec::IntoIter<usize>>,
    micro_batches: usize,
    rows: usize,
    pad_id: i32,
}

impl<I> BucketedBatches<I> {
    /// With gradient accumulation over `k` micro-batches per update: a trial run visits each
    /// bucket `k` times in a row, so it traces both the micro-batch graph and the update graph
    /// of every bucket (`--steps` of the trial: at least the number of buckets).
    pub fn accumulating(mut self, k: usize) -> Self {
        self.micro_batches = k.max(1);
        self
    }

    fn sweep(&mut self) -> &mut std::vec::IntoIter<usize> {
        let (lengths, k) = (self.buckets.lengths(), self.micro_batches);
        self.sweep.get_or_insert_with(|| {
            if !crate::trial::is_trial_run() {
                return Vec::new().into_iter();
            }
            tracing::warn!(
                "the trial run: the first {} batches visit every length bucket {lengths:?}{} so \
                 that the trial run traces (and neuron-pc compile compiles) each; run the \
                 trial for at least {} steps",
                lengths.len() * k,
                if k > 1 {
                    format!(", {k} micro-batches each")
                } else {
                    String::new()
                },
                lengths.len()
            );
            let sweep: Vec<usize> = lengths
                .iter()
                .flat_map(|&l| std::iter::repeat_n(l, k))
                .collect();
            sweep.into_iter()
        })
    }
}

impl<I: Iterator<Item = Vec<R>>, R: TokenRow> Iterator for BucketedBatches<I> {
    type Item = Result<PaddedTokens>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Some(length) = self.sweep().next() {
            // A trial run computes nothing: only the shape matters.
            let rows: Vec<Vec<i32>> = vec![vec![self.pad_id; length]; self.rows];
            return Some(Ok(pad_rows(&rows, length, self.pad_id)));
        }
        let batch = self.stream.next()?;
        Some(self.buckets.pad(&batch, self.pad_id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_chosen_as_the_smallest_that_fits() {
        let b = LengthBuckets::parse("64, 16,32").unwrap();
        assert_eq!(b.lengths(), &[16, 32, 64]);
        let picks: Vec<Option<usize>> = [1, 16, 17, 32, 33, 64, 65]
            .map(|n| b.bucket_for(n))
            .to_vec();
        assert_eq!(
            picks,
            [
                Some(16),
                Some(16),
                Some(32),
                Some(32),
                Some(64),
                Some(64),
                None
            ]
        );
        assert_eq!(
            LengthBuckets::parse("64..200").unwrap().lengths(),
            &[64, 128, 192, 200]
        );
        assert_eq!(
            LengthBuckets::multiples(64, 512).unwrap().lengths().len(),
            8
        );
        for bad in ["", "16,x", "0,16", "0..64", "..", "64..0"] {
            let e = LengthBuckets::parse(bad).unwrap_err().to_string();
            assert!(e.contains("length buckets"), "{bad:?}: {e}");
        }
    }

    #[test]
    fn padding_builds_the_mask_and_ignored_labels_and_counts_tokens() {
        let b = LengthBuckets::new([4, 8]).unwrap();
        let p = b.pad(&[vec![5, 6, 7], vec![9, 10, 11, 12, 13]], 0).unwrap();
        assert_eq!((p.length, p.tokens), (8, 8));
        assert_eq!(p.input_ids.dims(), &[2, 8]);
        assert_eq!(
            p.input_ids.to_vec::<i32>().unwrap(),
            [5, 6, 7, 0, 0, 0, 0, 0, 9, 10, 11, 12, 13, 0, 0, 0]
        );
        assert_eq!(
            p.attention_mask.to_vec::<i32>().unwrap(),
            [1, 1, 1, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0]
        );
        let n = -100;
        assert_eq!(
            p.labels.to_vec::<i32>().unwrap(),
            [5, 6, 7, n, n, n, n, n, 9, 10, 11, 12, 13, n, n, n]
        );
        let e = b.pad(&[vec![1; 3], vec![1; 9]], 0).unwrap_err().to_string();
        assert!(e.contains("sequence 1") && e.contains("9 tokens"), "{e}");
    }

    #[test]
    fn rows_with_their_own_labels_keep_them_and_pad_with_minus_100() {
        let b = LengthBuckets::new([4]).unwrap();
        let rows = [
            (vec![7, 8, 9], vec![-100, 8, 9]),
            (vec![5, 6], vec![6, -100]),
        ];
        let p = b.pad(&rows, 0).unwrap();
        let n = -100;
        assert_eq!(p.labels.to_vec::<i32>().unwrap(), [n, 8, 9, n, 6, n, n, n]);
        assert_eq!(p.tokens, 5);
        let bad = [(vec![1, 2], vec![1])];
        let e = b.pad(&bad, 0).unwrap_err().to_string();
        assert!(e.contains("2 tokens but 1 labels"), "{e}");
    }

    #[test]
    fn a_real_run_pads_each_batch_without_a_sweep() {
        let b = LengthBuckets::new([4, 8]).unwrap();
        let stream = vec![
            vec![vec![1; 3]; 2],
            vec![vec![1; 6]; 2],
            vec![vec![1; 2]; 2],
        ];
        let lengths: Vec<usize> = b.batches(stream, 2, 0).map(|p| p.unwrap().length).collect();
        assert_eq!(lengths, [4, 8, 4]);
    }
}
