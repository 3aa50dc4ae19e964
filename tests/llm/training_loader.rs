//! The device loader keeps training on one step graph: ragged batches come out padded (or
//! dropped) to one shape, and batches are prepared ahead on a background thread.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use neuron_pc::data::{DeviceLoader, LastBatch};
use neuron_pc::{grad, DType, HostTensor, LazyDevice, Tensor};

use crate::common::device;

/// A host batch of `rows` examples: `x f32 [rows, 3]`, `y f32 [rows]`.
fn host_batch(rows: usize, offset: usize) -> Vec<HostTensor> {
    let x: Vec<f32> = (0..rows * 3)
        .map(|i| ((i + offset) % 7) as f32 * 0.25 - 0.5)
        .collect();
    let y: Vec<f32> = (0..rows).map(|i| ((i + offset) % 3) as f32).collect();
    vec![
        HostTensor::from_slice(&x, &[rows, 3]).unwrap(),
        HostTensor::from_slice(&y, &[rows]).unwrap(),
    ]
}

/// One SGD step of least squares on `x, y`; returns the loss.
fn train_step(dev: &LazyDevice, w: &Tensor, x: &Tensor, y: &Tensor) -> Tensor {
    let pred = x.matmul(&w.reshape(&[3, 1]).unwrap()).unwrap();
    let err = pred.reshape(&[x.dims()[0]]).unwrap().sub(y).unwrap();
    let loss = err.mul(&err).unwrap().mean_all().unwrap();
    let g = grad(&loss, &[w]).unwrap();
    let lr = dev.scalar(0.1, DType::F32).unwrap();
    w.assign(&w.sub(&g[0].mul(&lr).unwrap()).unwrap()).unwrap();
    dev.mark_step().unwrap();
    loss
}

const RAGGED: [usize; 5] = [4, 2, 4, 3, 1];

fn ragged_stream() -> impl Iterator<Item = Vec<HostTensor>> + Send + 'static {
    RAGGED
        .into_iter()
        .enumerate()
        .map(|(i, r)| host_batch(r, i))
}

#[test]
fn padded_ragged_batches_train_on_one_graph() {
    let dev = device();
    let w = dev.tensor(&HostTensor::zeros(DType::F32, &[3])).unwrap();
    let loader = DeviceLoader::new(&dev, ragged_stream(), 4, LastBatch::Pad, 2);
    let mut valid = Vec::new();
    for batch in loader {
        let batch = batch.unwrap();
        assert_eq!(batch.tensors[0].dims(), &[4, 3]);
        assert_eq!(batch.tensors[1].dims(), &[4]);
        valid.push(batch.valid);
        let loss = train_step(&dev, &w, &batch.tensors[0], &batch.tensors[1]);
        assert!(loss.item().unwrap().is_finite());
    }
    assert_eq!(valid, RAGGED.to_vec());
    let m = dev.metrics();
    assert_eq!(
        (m.executions, m.graphs_seen, m.compiles),
        (5, 1, 1),
        "{m:?}"
    );
    assert_eq!(m.recompiles_after_warmup, 0);
}

#[test]
fn dropped_partial_batches_train_on_one_graph() {
    let dev = device();
    let w = dev.tensor(&HostTensor::zeros(DType::F32, &[3])).unwrap();
    let loader = DeviceLoader::new(&dev, ragged_stream(), 4, LastBatch::Drop, 2);
    let mut indices = Vec::new();
    for batch in loader {
        let batch = batch.unwrap();
        assert_eq!(batch.valid, 4);
        indices.push(batch.index);
        train_step(&dev, &w, &batch.tensors[0], &batch.tensors[1]);
    }
    assert_eq!(indices, vec![0, 2]);
    assert_eq!(dev.metrics().graphs_seen, 1);
}

/// The same ragged stream fed straight to the device makes one graph per distinct batch size:
/// what the loader exists to prevent (and proof the counters above can see it).
#[test]
fn without_the_loader_every_batch_size_is_a_new_graph() {
    let dev = device();
    let w = dev.tensor(&HostTensor::zeros(DType::F32, &[3])).unwrap();
    for host in ragged_stream() {
        let x = dev.tensor(&host[0]).unwrap();
        let y = dev.tensor(&host[1]).unwrap();
        train_step(&dev, &w, &x, &y);
    }
    let m = dev.metrics();
    assert_eq!((m.graphs_seen, m.recompiles_after_warmup), (4, 2), "{m:?}");
}

#[test]
fn batches_are_prepared_ahead_but_only_up_to_the_prefetch_depth() {
    let dev = device();
    let produced = Arc::new(AtomicUsize::new(0));
    let counter = produced.clone();
    let stream = (0..100).map(move |i| {
        counter.fetch_add(1, Ordering::SeqCst);
        host_batch(4, i)
    });
    let mut loader = DeviceLoader::new(&dev, stream, 4, LastBatch::Drop, 2);
    // Nothing has been asked for yet: the background thread fills the queue and then waits.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while produced.load(Ordering::SeqCst) < 2 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(200));
    let ahead = produced.load(Ordering::SeqCst);
    // two queued, at most one more held by the blocked sender
    assert!((2..=3).contains(&ahead), "prepared {ahead} batches ahead");
    let first = loader.next().unwrap().unwrap();
    assert_eq!(first.index, 0);
    assert_eq!(
        first.tensors[1].to_vec::<f32>().unwrap(),
        vec![0.0, 1.0, 2.0, 0.0]
    );
    drop(loader); // stops the worker; must not hang
    assert!(produced.load(Ordering::SeqCst) < 100);
}
