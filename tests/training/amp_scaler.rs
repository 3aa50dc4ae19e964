//! `GradScaler`: float16 gradients that underflow without loss scaling survive with it, the
//! unscaled gradients equal the true ones, overflowing steps are skipped with a backoff, and the
//! scale grows after clean steps.

use neuron_pc::amp::GradScaler;
use neuron_pc::{grad, DType, DeviceConfig, LazyDevice, Tensor};

fn device() -> LazyDevice {
    let config = DeviceConfig {
        cache: neuron_pc::compile::CacheConfig::disabled(),
        warmup_steps: u64::MAX,
        ..DeviceConfig::default()
    };
    LazyDevice::new(config).expect("cpu device: run scripts/setup")
}

/// A float16 loss whose gradient with respect to the f32 parameter `p` is `b * c` per
/// element: computed in f16, `1 * c * b` underflows when it is below 6e-8. `b` and `c` are
/// device data, not graph constants, so no compiler folds `b * c` into one (zero) constant.
fn loss16(p: &Tensor, b: f64, c: f64) -> Tensor {
    let dev = p.device().unwrap();
    let b = dev.scalar(b, DType::F16).unwrap();
    let c = dev.scalar(c, DType::F16).unwrap();
    p.to_dtype(DType::F16)
        .unwrap()
        .mul(&b)
        .unwrap()
        .mul(&c)
        .unwrap()
        .sum_all()
        .unwrap()
}

#[test]
fn scaling_rescues_underflowing_fp16_gradients() {
    let dev = device();
    let p = dev.from_slice(&[0.5f32, -1.0, 2.0], &[3]).unwrap();
    let (b, c) = (1e-4, 2e-4); // d loss / dp = 2e-8, below float16's smallest subnormal
    let plain = grad(&loss16(&p, b, c), &[&p]).unwrap();
    assert_eq!(plain[0].to_vec::<f32>().unwrap(), vec![0.0; 3], "underflow");

    // 2^12: the scaled gradient 8e-5 is a normal float16, and nothing overflows
    let mut scaler = GradScaler::with_scale(&dev, 4096.0);
    let scaled = scaler.scale(&loss16(&p, b, c)).unwrap();
    assert_eq!(scaled.dtype(), DType::F32);
    let mut grads = grad(&scaled, &[&p]).unwrap();
    let found_inf = scaler.unscale(&mut grads).unwrap();
    assert_eq!(grads[0].dtype(), DType::F32);
    let g = grads[0].to_vec::<f32>().unwrap();
    for v in g {
        // float16 carries 11 bits: relative error up to ~2^-10 per rounding
        assert!((v as f64 - b * c).abs() < 3e-3 * b * c, "{v}");
    }
    assert!(scaler.update(&found_inf).unwrap(), "a clean step runs");
    assert_eq!(scaler.scale_value(), 4096.0);
}

#[test]
fn overflow_skips_the_step_and_backs_off_then_grows() {
    let dev = device();
    let p = dev.from_slice(&[0.5f32, -1.0], &[2]).unwrap();
    let mut scaler = GradScaler::new(&dev);
    scaler.growth_interval = 2;
    // the cotangent entering the float16 part, 4 * scale, overflows float16 (max 65504) until
    // the scale is 8192
    let mut grads = grad(&scaler.scale(&loss16(&p, 2.0, 2.0)).unwrap(), &[&p]).unwrap();
    let found_inf = scaler.unscale(&mut grads).unwrap();
    assert!(
        !scaler.update(&found_inf).unwrap(),
        "the overflowing step is skipped"
    );
    assert_eq!(scaler.scale_value(), 32768.0);
    let mut scale_steps = Vec::new();
    loop {
        let mut grads = grad(&scaler.scale(&loss16(&p, 2.0, 2.0)).unwrap(), &[&p]).unwrap();
        let found_inf = scaler.unscale(&mut grads).unwrap();
        let ran = scaler.update(&found_inf).unwrap();
        scale_steps.push((ran, scaler.scale_value()));
        if ran {
            // unscaled, the gradient is exactly 4
            assert_eq!(grads[0].to_vec::<f32>().unwrap(), vec![4.0, 4.0]);
            break;
        }
        assert!(scale_steps.len() < 10, "{scale_steps:?}");
    }
    assert_eq!(
        scale_steps,
        vec![(false, 16384.0), (false, 8192.0), (true, 8192.0)]
    );
    // a second clean step reaches the growth interval of 2: the scale doubles
    let mut grads = grad(&scaler.scale(&loss16(&p, 2.0, 2.0)).unwrap(), &[&p]).unwrap();
    let found_inf = scaler.unscale(&mut grads).unwrap();
    assert!(scaler.update(&found_inf).unwrap());
    assert_eq!(scaler.scale_value(), 16384.0);

    // a NaN gradient counts as an overflow too
    let nan = dev.from_slice(&[f32::NAN, 1.0], &[2]).unwrap();
    let mut grads = vec![nan];
    let found_inf = scaler.unscale(&mut grads).unwrap();
    assert!(!scaler.update(&found_inf).unwrap());
    assert_eq!(scaler.scale_value(), 8192.0);
}
