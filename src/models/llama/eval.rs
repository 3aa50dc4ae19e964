//! [`LlamaForCausalLM::eval_loss`]: the mean loss of held-out packed rows (validation loss,
//! and its exponential, the perplexity).

use super::LlamaForCausalLM;
use crate::data::PackedRows;
use crate::error::{Error, Result};
use crate::tensor::Reduction;

impl LlamaForCausalLM {
    /// The mean over batches of `batch` rows of `rows` (every row once; a last partial batch
    /// is completed from the first rows, so every batch has one shape: one graph) of
    /// [`LlamaForCausalLM::loss_packed`]. On a data-parallel device each batch is split over
    /// the replicas as training batches are, and their losses averaged; a process of a
    /// multi-process run reads only its replicas' rows.
    pub fn eval_loss(&self, rows: &PackedRows, batch: usize) -> Result<f64> {
        if batch == 0 || rows.rows() == 0 {
            return Err(Error::Config(format!(
                "eval_loss: {} rows in batches of {batch}",
                rows.rows()
            )));
        }
        let dev = self.model.embed_tokens.weight.device()?;
        let batches = rows.rows().div_ceil(batch);
        // this process's rows of each batch only (all of them in a one-process run)
        let mine = dev.local_rows(batch)?;
        let mut sum = 0.0;
        for i in 0..batches {
            let host = rows.batch(i * batch + mine.start, mine.len());
            let [ids, positions, labels] =
                [&host[0], &host[1], &host[2]].map(|t| dev.shard_local(t));
            let loss = self
                .loss_packed(&ids?, &positions?, &labels?)?
                .all_reduce(Reduction::Mean)?;
            dev.mark_step()?;
            sum += loss.item()?;
        }
        Ok(sum / batches as f64)
    }
}
