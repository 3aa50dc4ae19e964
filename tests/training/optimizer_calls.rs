//! AdamW's per-parameter update recorded as calls of a function traced once
//! (`src/optim/traced.rs`): the same numbers as the update written op by op, bit for bit, with
//! a few recorded nodes per parameter instead of one per op; a changed setting traces anew.
//! SGD (momentum and weight decay) likewise.

use neuron_pc::optim::AdamW;
use neuron_pc::{DType, DeviceConfig, LazyDevice, Result, Tensor};

fn device() -> LazyDevice {
    let config = DeviceConfig {
        cache: neuron_pc::compile::CacheConfig::disabled(),
        ..DeviceConfig::default()
    };
    LazyDevice::new(config).expect("cpu device: run scripts/setup")
}

/// Two parameters of different shapes and, per step, gradients from a fixed formula.
fn setup(dev: &LazyDevice) -> (Vec<Tensor>, impl Fn(usize) -> Vec<Tensor> + '_) {
    let w: Vec<f32> = (0..12).map(|i| (i as f32 * 0.37).sin()).collect();
    let b: Vec<f32> = (0..3).map(|i| 0.1 * i as f32 - 0.2).collect();
    let params = vec![
        dev.from_slice(&w, &[4, 3]).unwrap(),
        dev.from_slice(&b, &[3]).unwrap(),
    ];
    let grads = move |step: usize| {
        let g = |n: usize, k: f32| -> Vec<f32> {
            (0..n).map(|i| ((i + 3 * step) as f32 * k).cos()).collect()
        };
        vec![
            dev.from_slice(&g(12, 0.91), &[4, 3]).unwrap(),
            dev.from_slice(&g(3, 1.7), &[3]).unwrap(),
        ]
    };
    (params, grads)
}

/// AdamW written op by op on the device (PyTorch's formula, in the order `AdamW::step`
/// computes it), its state `(m, v, t)` updated in place; returns the step graph's op count.
struct ByHand {
    m: Vec<Tensor>,
    v: Vec<Tensor>,
    t: Tensor,
}

impl ByHand {
    fn new(dev: &LazyDevice, params: &[Tensor]) -> ByHand {
        let zeros = |p: &Tensor| dev.zeros(p.dims(), DType::F32).unwrap();
        ByHand {
            m: params.iter().map(zeros).collect(),
            v: params.iter().map(zeros).collect(),
            t: dev.scalar(0.0, DType::F32).unwrap(),
        }
    }

    fn step(
        &mut self,
        params: &[Tensor],
        grads: &[Tensor],
        lr: &Tensor,
        (b1, b2, eps, wd): (f64, f64, f64, f64),
    ) -> Result<()> {
        let t = self.t.add_scalar(1.0)?;
        let bc1 = t.constant_like(b1)?.pow(&t)?.neg()?.add_scalar(1.0)?;
        let bc2 = t.constant_like(b2)?.pow(&t)?.neg()?.add_scalar(1.0)?;
        let step_size = lr.div(&bc1)?;
        let bc2_rsqrt = bc2.rsqrt()?;
        let decay = lr.mul_scalar(-wd)?.add_scalar(1.0)?;
        for (i, (p, g)) in params.iter().zip(grads).enumerate() {
            let m = self.m[i].mul_scalar(b1)?.add(&g.mul_scalar(1.0 - b1)?)?;
            let v = self.v[i]
                .mul_scalar(b2)?
                .add(&g.mul(g)?.mul_scalar(1.0 - b2)?)?;
            let denom = v.sqrt()?.mul(&bc2_rsqrt)?.add_scalar(eps)?;
            p.assign(&p.mul(&decay)?.sub(&m.div(&denom)?.mul(&step_size)?)?)?;
            self.m[i].assign(&m)?;
            self.v[i].assign(&v)?;
        }
        self.t.assign(&t)
    }
}

fn values(ts: &[Tensor]) -> Vec<Vec<f32>> {
    ts.iter().map(|t| t.to_vec::<f32>().unwrap()).collect()
}

#[test]
fn adamws_calls_compute_the_ops_numbers_bit_for_bit_with_fewer_recorded_nodes() {
    let dev = device();
    let (params, grads) = setup(&dev);
    let (mine, mine_grads) = setup(&dev);
    let mut opt = AdamW::new(&dev, &params, 0.05).unwrap();
    let mut by_hand = ByHand::new(&dev, &mine);
    dev.mark_step().unwrap();
    let lr = dev.scalar(0.01, DType::F32).unwrap();
    let (mut with_calls, mut op_by_op) = (0, 0);
    for step in 0..4 {
        if step == 2 {
            // a setting changed between steps is baked into a new traced update
            opt.beta1 = 0.8;
            opt.eps = 1e-3;
        }
        opt.step(&params, &grads(step), &lr).unwrap();
        dev.mark_step().unwrap();
        with_calls = dev.metrics().last_step_ops;
        let settings = (opt.beta1, opt.beta2, opt.eps, opt.weight_decay);
        by_hand
            .step(&mine, &mine_grads(step), &lr, settings)
            .unwrap();
        dev.mark_step().unwrap();
        op_by_op = dev.metrics().last_step_ops;
        assert_eq!(
            values(&params),
            values(&mine),
            "parameters after step {step}"
        );
        assert_eq!(
            values(&opt.exp_avg),
            values(&by_hand.m),
            "exp_avg after {step}"
        );
        assert_eq!(
            values(&opt.exp_avg_sq),
            values(&by_hand.v),
            "exp_avg_sq after {step}"
        );
    }
    // per parameter: the read after the gradients and three call results, against the 14 ops
    // of the update written out (the shared bias corrections are recorded by both): 24 and 59
    assert!(
        with_calls + 2 * 14 <= op_by_op,
        "{with_calls} recorded ops with calls, {op_by_op} op by op"
    );
}

#[test]
fn sgds_calls_compute_the_ops_numbers_bit_for_bit() {
    let dev = device();
    let (params, grads) = setup(&dev);
    let (mine, mine_grads) = setup(&dev);
    let mut opt = neuron_pc::optim::Sgd::new(&dev, &params, 0.9, 0.01).unwrap();
    let mut buffers: Vec<Tensor> = (mine.iter())
        .map(|p| dev.zeros(p.dims(), DType::F32).unwrap())
        .collect();
    dev.mark_step().unwrap();
    let lr = dev.scalar(0.05, DType::F32).unwrap();
    for step in 0..3 {
        opt.step(&params, &grads(step), &lr).unwrap();
        dev.mark_step().unwrap();
        // torch.optim.SGD: g + wd * p, then the momentum buffer, then p - lr * buffer
        for ((p, g), b) in mine.iter().zip(mine_grads(step)).zip(&mut buffers) {
            let g = g.add(&p.mul_scalar(0.01).unwrap()).unwrap();
            let next = b.mul_scalar(0.9).unwrap().add(&g).unwrap();
            b.assign(&next).unwrap();
            p.assign(&p.sub(&next.mul(&lr).unwrap()).unwrap()).unwrap();
        }
        dev.mark_step().unwrap();
        assert_eq!(
            values(&params),
            values(&mine),
            "parameters after step {step}"
        );
        assert_eq!(
            values(&opt.momentum_buffer),
            values(&buffers),
            "buffers after {step}"
        );
    }
}
