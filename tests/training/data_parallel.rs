//! Replicated (SPMD) execution over several cpu devices of one process: placement of values,
//! collectives against host math, the clear errors for mixing per-replica and replicated
//! values, and cache keys that depend on the replica count.

use neuron_pc::compile::CacheConfig;
use neuron_pc::tensor::Reduction;
use neuron_pc::{DeviceConfig, Error, HostTensor, LazyDevice};

use crate::common::replicated as device;

fn host(v: &[f32], dims: &[usize]) -> HostTensor {
    HostTensor::from_slice(v, dims).unwrap()
}

fn f32s(h: &HostTensor) -> Vec<f32> {
    h.to_vec::<f32>().unwrap()
}

#[test]
fn shards_replicas_and_collectives_match_host_math() {
    for n in [1, 2, 4] {
        let dev = device(n);
        assert_eq!(dev.replicas(), n);
        // 16 rows of 3: replica r holds rows 16r/n..16(r+1)/n
        let rows: Vec<f32> = (0..48).map(|i| (i as f32) * 0.25 - 3.0).collect();
        let x = dev.shard(&host(&rows, &[16, 3])).unwrap();
        assert_eq!(x.dims(), &[16 / n, 3]);
        assert!(x.is_per_replica());
        let w = dev.tensor(&host(&[1.0, -2.0, 0.5], &[3])).unwrap();
        assert!(!w.is_per_replica());
        let y = x.mul(&w).unwrap(); // per-replica
        assert!(y.is_per_replica());
        let local = y.sum(&[0, 1], false).unwrap();
        let total = local.all_reduce(Reduction::Sum).unwrap();
        let mean = local.all_reduce(Reduction::Mean).unwrap();
        let max = local.all_reduce(Reduction::Max).unwrap();
        let gathered = x.all_gather(0).unwrap();
        let scattered = y.reduce_scatter(Reduction::Sum, 0).unwrap();
        let id = dev.replica_index().unwrap();
        assert!(!total.is_per_replica() && !gathered.is_per_replica());
        assert!(scattered.is_per_replica());
        dev.mark_step().unwrap();

        let wv = [1.0f32, -2.0, 0.5];
        let block = 16 / n;
        let local_sums: Vec<f32> = (0..n)
            .map(|r| {
                (r * block * 3..(r + 1) * block * 3)
                    .map(|i| rows[i] * wv[i % 3])
                    .sum()
            })
            .collect();
        let want_total: f32 = local_sums.iter().sum();
        assert!((total.item().unwrap() as f32 - want_total).abs() < 1e-4);
        assert!((mean.item().unwrap() as f32 - want_total / n as f32).abs() < 1e-4);
        let want_max = local_sums.iter().cloned().fold(f32::MIN, f32::max);
        assert_eq!(max.item().unwrap() as f32, want_max);
        assert_eq!(f32s(&gathered.to_host().unwrap()), rows);
        let per = local.to_host_replicas().unwrap();
        assert_eq!(per.len(), n);
        for (r, h) in per.iter().enumerate() {
            assert!((f32s(h)[0] - local_sums[r]).abs() < 1e-4, "replica {r}");
        }
        // reduce_scatter: the sum over replicas of y, block r on replica r
        let ys: Vec<Vec<f32>> = y.to_host_replicas().unwrap().iter().map(f32s).collect();
        let summed: Vec<f32> = (0..block * 3)
            .map(|i| ys.iter().map(|v| v[i]).sum())
            .collect();
        let sub = block / n;
        for (r, h) in scattered.to_host_replicas().unwrap().iter().enumerate() {
            assert_eq!(h.dims(), &[sub, 3]);
            let want = &summed[r * sub * 3..(r + 1) * sub * 3];
            for (a, b) in f32s(h).iter().zip(want) {
                assert!((a - b).abs() < 1e-5, "replica {r}: {a} vs {b}");
            }
        }
        let ids: Vec<u32> = id
            .to_host_replicas()
            .unwrap()
            .iter()
            .map(|h| h.to_vec::<u32>().unwrap()[0])
            .collect();
        assert_eq!(ids, (0..n as u32).collect::<Vec<_>>());
    }
}

#[test]
fn grouped_collectives_combine_within_each_group() {
    let dev = device(4);
    let vals: Vec<HostTensor> = (0..4).map(|r| host(&[r as f32 + 1.0], &[1])).collect();
    let x = dev.from_replicas(&vals).unwrap();
    let pairs = [vec![0, 1], vec![2, 3]];
    let interleaved = [vec![0, 2], vec![1, 3]];
    let a = x.all_reduce_in(Reduction::Sum, &pairs).unwrap();
    let b = x.all_reduce_in(Reduction::Sum, &interleaved).unwrap();
    let g = x.all_gather_in(0, &interleaved).unwrap();
    assert!(a.is_per_replica() && b.is_per_replica());
    dev.mark_step().unwrap();
    let read = |t: &neuron_pc::Tensor| -> Vec<Vec<f32>> {
        t.to_host_replicas().unwrap().iter().map(f32s).collect()
    };
    assert_eq!(read(&a), [[3.0], [3.0], [7.0], [7.0]]);
    assert_eq!(read(&b), [[4.0], [6.0], [4.0], [6.0]]);
    assert_eq!(read(&g), [[1.0, 3.0], [2.0, 4.0], [1.0, 3.0], [2.0, 4.0]]);
    // not a partition of the 4 replicas
    for bad in [
        vec![vec![0, 1]],
        vec![vec![0, 1], vec![1, 2]],
        vec![vec![0, 1, 2], vec![3]],
    ] {
        let e = x.all_reduce_in(Reduction::Sum, &bad).unwrap_err();
        assert!(e.to_string().contains("must split the 4 replicas"), "{e}");
    }
}

#[test]
fn mixing_per_replica_and_replicated_values_wrongly_is_a_clear_error() {
    let dev = device(2);
    let param = dev.tensor(&host(&[1.0, 2.0], &[2])).unwrap();
    param.set_name("layer.weight");
    let batch = dev.shard(&host(&[1.0, 2.0, 3.0, 4.0], &[2, 2])).unwrap();
    let grad = batch.sum(&[0], false).unwrap();
    // assigning a per-replica gradient step to a replicated parameter would diverge
    let stepped = param.sub(&grad).unwrap();
    let e = param.assign(&stepped).unwrap_err();
    assert!(matches!(e, Error::Placement { .. }), "{e}");
    let msg = e.to_string();
    assert!(msg.contains("data_parallel.rs:"), "{msg}");
    assert!(
        msg.contains("layer.weight") && msg.contains("diverge"),
        "{msg}"
    );
    // averaged first, it is fine
    let avg = grad.all_reduce(Reduction::Mean).unwrap();
    param.assign(&param.sub(&avg).unwrap()).unwrap();
    // a per-replica value read as one host tensor
    let e = grad.to_host().unwrap_err();
    assert!(e.to_string().contains("to_host_replicas()"), "{e}");
    dev.mark_step().unwrap();
    // (1+3)/2 = 2 and (2+4)/2 = 3 subtracted on both replicas: bit-identical
    let p = param.to_host_replicas().unwrap();
    assert_eq!(f32s(&p[0]), [-1.0, -1.0]);
    assert_eq!(p[0], p[1]);
    // shapes that do not split, and from_replicas with the wrong count
    let e = dev.shard(&host(&[1.0, 2.0, 3.0], &[3])).unwrap_err();
    assert!(e.to_string().contains("cannot shard"), "{e}");
    let e = dev.from_replicas(&[host(&[1.0], &[1])]).unwrap_err();
    assert!(e.to_string().contains("needs 2 values"), "{e}");
    // a mean of integers
    let ints = dev.from_slice(&[1i32, 2], &[2]).unwrap();
    assert!(ints.all_reduce(Reduction::Mean).is_err());
    assert!(ints.all_reduce(Reduction::Sum).is_ok());
}

#[test]
fn on_one_device_per_replica_values_read_and_assign_as_before() {
    let dev = device(1);
    let param = dev.tensor(&host(&[1.0, 2.0], &[2])).unwrap();
    let batch = dev.shard(&host(&[1.0, 2.0], &[1, 2])).unwrap();
    let grad = batch.sum(&[0], false).unwrap();
    param.assign(&param.sub(&grad).unwrap()).unwrap();
    assert_eq!(param.to_vec::<f32>().unwrap(), [0.0, 0.0]);
    assert_eq!(grad.to_vec::<f32>().unwrap(), [1.0, 2.0]);
}

#[test]
fn the_replica_count_is_in_the_key_and_equal_counts_share_entries() {
    let dir = std::env::temp_dir().join(format!("npc-dp-keys-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let url = dir.display().to_string();
    let run = |n: usize| {
        let dev = LazyDevice::new(DeviceConfig {
            cache: CacheConfig::resolve(Some(&url), &Default::default()).unwrap(),
            replicas: n,
            ..DeviceConfig::default()
        })
        .unwrap();
        let x = dev.shard(&host(&[1.0, 2.0, 3.0, 4.0], &[4])).unwrap();
        let s = x.exp().unwrap().sum(&[0], false).unwrap();
        let t = s.all_reduce(Reduction::Sum).unwrap();
        dev.mark_step().unwrap();
        let want: f32 = [1.0f32, 2.0, 3.0, 4.0].iter().map(|v| v.exp()).sum();
        assert!((t.item().unwrap() as f32 - want).abs() < 1e-3);
        dev.metrics()
    };
    let two = run(2);
    assert_eq!((two.compiles, two.disk_hits), (1, 0));
    let four = run(4); // another replica count: another program
    assert_eq!((four.compiles, four.disk_hits), (1, 0));
    let again = run(2); // the same count: the entry of the first run
    assert_eq!((again.compiles, again.disk_hits), (0, 1));
    let _ = std::fs::remove_dir_all(&dir);
}
