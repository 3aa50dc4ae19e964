//! Results that must not silently differ from PyTorch: `cross_entropy`'s `ignore_index` default
//! (-100) and logits of any rank, index checks (`NEURON_PC_CHECK_INDICES`) that turn an
//! out-of-range label, embedding row or gather index into an error naming the op and the line,
//! XLA's documented behaviour without them, and the recompile warning that tells a missing
//! `mark_step` from shapes that vary.

use neuron_pc::compile::CacheConfig;
use neuron_pc::nn::{cross_entropy, cross_entropy_with, CrossEntropyOptions, Embedding, HostRng};
use neuron_pc::{DType, DeviceConfig, Error, HostTensor, LazyDevice, Tensor};

fn device(check_indices: bool) -> LazyDevice {
    LazyDevice::new(DeviceConfig {
        cache: CacheConfig::disabled(),
        check_indices,
        ..DeviceConfig::default()
    })
    .expect("cpu device: run scripts/setup")
}

fn f32s(dev: &LazyDevice, v: &[f32], dims: &[usize]) -> Tensor {
    dev.tensor(&HostTensor::from_slice(v, dims).unwrap())
        .unwrap()
}

fn i32s(dev: &LazyDevice, v: &[i32], dims: &[usize]) -> Tensor {
    dev.tensor(&HostTensor::from_slice(v, dims).unwrap())
        .unwrap()
}

/// `-log softmax(row)[label]` in f64 on the host.
fn nll(row: &[f32], label: usize) -> f64 {
    let m = row.iter().fold(f64::MIN, |a, &b| a.max(b as f64));
    let z: f64 = row.iter().map(|&x| (x as f64 - m).exp()).sum();
    -((row[label] as f64 - m) - z.ln())
}

#[test]
fn cross_entropy_ignores_minus_100_by_default_as_pytorch_does() {
    let dev = device(false);
    // Uniform logits over 5 classes: every counted row costs ln 5. PyTorch: 1.6094; counting
    // the two padded rows as zeros would give half of it.
    let logits = f32s(&dev, &[0.0; 20], &[4, 5]);
    let labels = i32s(&dev, &[1, 2, -100, -100], &[4]);
    let loss = cross_entropy(&logits, &labels).unwrap().item().unwrap();
    assert!((loss - 5f64.ln()).abs() < 1e-6, "{loss}");
    // Asking for no ignored label: -100 is then an (unchecked) out-of-range label.
    let none = CrossEntropyOptions {
        ignore_index: None,
        ..CrossEntropyOptions::default()
    };
    let all = cross_entropy_with(&logits, &labels, none)
        .unwrap()
        .item()
        .unwrap();
    assert!((all - 5f64.ln() / 2.0).abs() < 1e-6, "{all}");
    assert_eq!(CrossEntropyOptions::default().ignore_index, Some(-100));
}

#[test]
fn cross_entropy_takes_language_model_logits_of_any_rank() {
    let dev = device(false);
    let v: Vec<f32> = (0..2 * 3 * 4)
        .map(|i| ((i * 7) % 11) as f32 * 0.3 - 1.0)
        .collect();
    let labels = [3, 0, -100, 1, 2, 3];
    let logits = f32s(&dev, &v, &[2, 3, 4]);
    let l = i32s(&dev, &labels, &[2, 3]);
    let got = cross_entropy(&logits, &l).unwrap().item().unwrap();
    let rows: Vec<f64> = labels
        .iter()
        .enumerate()
        .filter(|(_, &y)| y != -100)
        .map(|(i, &y)| nll(&v[i * 4..i * 4 + 4], y as usize))
        .collect();
    let want = rows.iter().sum::<f64>() / rows.len() as f64;
    assert!(
        (got - want).abs() < 1e-5 * want.abs().max(1.0),
        "{got} vs {want}"
    );
    // labels must have the logits' leading dimensions
    let bad = i32s(&dev, &[0; 6], &[6]);
    let e = cross_entropy(&logits, &bad).unwrap_err().to_string();
    assert!(
        e.contains("leading dimensions [2, 3]") && e.contains("pytorch_defaults.rs"),
        "{e}"
    );
}

// `line!() - 1` below: the line of the op call just above it.

/// Unwraps the error of `r` as an index error and returns its message.
fn index_error<T: std::fmt::Debug>(r: neuron_pc::Result<T>) -> String {
    match r {
        Err(e @ Error::IndexOutOfRange { .. }) => e.to_string(),
        other => panic!("expected an index error, got {other:?}"),
    }
}

#[test]
fn an_out_of_range_label_is_an_error_naming_the_op_and_line_with_checks_on() {
    let dev = device(true);
    let logits = f32s(&dev, &[0.5; 20], &[4, 5]);
    let labels = i32s(&dev, &[1, 7, -100, 4], &[4]);
    let loss = cross_entropy(&logits, &labels).unwrap();
    let line = line!() - 1;
    dev.mark_step().unwrap();
    let e = index_error(loss.item());
    assert!(e.contains(&format!("pytorch_defaults.rs:{line}")), "{e}");
    // the first step is step 1, as a failed step's error counts it
    assert!(e.contains("index out of range in step 1:"), "{e}");
    assert!(
        e.contains("cross_entropy") && e.contains("1 of 4 labels outside [0, 5)"),
        "{e}"
    );
    assert!(
        e.contains("largest 7") && e.contains("NEURON_PC_CHECK_INDICES"),
        "{e}"
    );
    // reported once; the device goes on
    let ok = cross_entropy(&logits, &i32s(&dev, &[1, 0, -100, 4], &[4])).unwrap();
    assert!((ok.item().unwrap() - 5f64.ln()).abs() < 1e-6);
    // a negative label other than the ignored one is out of range too
    let neg = cross_entropy(&logits, &i32s(&dev, &[-3, 0, 0, 0], &[4])).unwrap();
    let e = index_error(neg.item());
    assert!(e.contains("smallest -3"), "{e}");
}

#[test]
fn an_embedding_index_past_the_table_is_an_error_with_checks_on_and_clamped_without() {
    for checked in [false, true] {
        let dev = device(checked);
        let emb = Embedding::new(&dev, &mut HostRng::new(3), 4, 2).unwrap();
        let table = emb.weight.to_vec::<f32>().unwrap();
        let ids = i32s(&dev, &[0, 9], &[2]);
        let rows = emb.forward(&ids).unwrap();
        let line = line!() - 1;
        // no read yet: the check's result arrives at the next mark_step or read
        dev.mark_step().unwrap();
        if checked {
            let e = index_error(dev.synchronize());
            assert!(e.contains(&format!("pytorch_defaults.rs:{line}")), "{e}");
            assert!(e.contains("embedding: index out of range"), "{e}");
            assert!(e.contains("1 of 2 indices"), "{e}");
            assert!(
                e.contains("outside [0, 4)") && e.contains("largest 9"),
                "{e}"
            );
        } else {
            // XLA clamps the row into the table: 9 reads row 3 (documented)
            let got = rows.to_vec::<f32>().unwrap();
            assert_eq!(&got[2..], &table[6..8]);
            dev.synchronize().unwrap();
        }
    }
}

#[test]
fn a_gather_index_out_of_range_is_an_error_with_checks_on() {
    let dev = device(true);
    let x = f32s(&dev, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
    let good = x.gather(1, &i32s(&dev, &[2, 0], &[2, 1])).unwrap();
    assert_eq!(good.to_vec::<f32>().unwrap(), vec![3.0, 4.0]);
    let bad = x.gather(1, &i32s(&dev, &[3, 0], &[2, 1])).unwrap();
    let line = line!() - 1;
    dev.mark_step().unwrap();
    // the next mark_step reports it once the step has finished
    let e = loop {
        std::thread::sleep(std::time::Duration::from_millis(20));
        let y = good.mul_scalar(2.0).unwrap();
        match dev.mark_step() {
            Ok(()) => drop(y),
            Err(e) => break e.to_string(),
        }
    };
    assert!(
        e.contains(&format!("pytorch_defaults.rs:{line}")) && e.contains("gather"),
        "{e}"
    );
    assert!(e.contains("outside [0, 3)"), "{e}");
    drop(bad);
}

#[test]
fn in_range_indices_pass_the_checks_and_give_the_unchecked_results() {
    let mut values = Vec::new();
    for checked in [false, true] {
        let dev = device(checked);
        let emb = Embedding::new(&dev, &mut HostRng::new(5), 6, 3).unwrap();
        let ids = i32s(&dev, &[5, 0, 2, 2], &[2, 2]);
        let logits = emb.forward(&ids).unwrap().reshape(&[4, 3]).unwrap();
        let labels = i32s(&dev, &[2, -100, 0, 1], &[4]);
        let loss = cross_entropy(&logits, &labels).unwrap();
        dev.mark_step().unwrap();
        values.push(loss.item().unwrap());
        dev.synchronize().unwrap();
    }
    assert_eq!(values[0], values[1]);
}

#[test]
fn a_graph_that_grows_step_after_step_is_called_a_missing_mark_step() {
    let dev = LazyDevice::new(DeviceConfig {
        cache: CacheConfig::disabled(),
        fail_on_new_graph_after_warmup: true,
        ..DeviceConfig::default()
    })
    .unwrap();
    let w = f32s(&dev, &[0.5, -0.5], &[2]);
    let x = f32s(&dev, &[1.0, 2.0], &[2]);
    let mut outcome = Ok(0.0);
    // A training loop that reads the loss each step but never calls mark_step: the update
    // of `w` stays pending, so each read's graph holds every step so far.
    for _ in 0..4 {
        let loss = w.mul(&x).unwrap().sum_all().unwrap();
        let grad = x.mul_scalar(0.1).unwrap();
        w.assign(&w.sub(&grad).unwrap()).unwrap();
        outcome = loss.item();
        let line = line!() - 1;
        if let Err(e) = &outcome {
            let msg = e.to_string();
            assert!(msg.contains("grows step after step"), "{msg}");
            assert!(msg.contains("missing mark_step"), "{msg}");
            assert!(
                msg.contains(&format!("pytorch_defaults.rs:{line}")),
                "{msg}"
            );
            assert!(!msg.contains("fixed-size batches"), "{msg}");
            break;
        }
    }
    assert!(outcome.is_err(), "a growing graph was not reported");
}

#[test]
fn shapes_that_vary_are_still_called_varying_shapes() {
    let dev = LazyDevice::new(DeviceConfig {
        cache: CacheConfig::disabled(),
        fail_on_new_graph_after_warmup: true,
        ..DeviceConfig::default()
    })
    .unwrap();
    let mut outcome = Ok(());
    for n in [4usize, 4, 4, 3] {
        let x = dev.tensor(&HostTensor::zeros(DType::F32, &[n, 2])).unwrap();
        let _y = x.relu().unwrap().sum_all().unwrap();
        outcome = dev.mark_step();
    }
    let msg = outcome.unwrap_err().to_string();
    assert!(
        msg.contains("shapes vary") && msg.contains("fixed-size batches"),
        "{msg}"
    );
    assert!(!msg.contains("missing mark_step"), "{msg}");
}
