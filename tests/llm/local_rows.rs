//! A process reads only its share of each global batch (`LazyDevice::local_rows`,
//! `DeviceLoader::for_local_rows`): its replicas' rows in a multi-process run, placed on its
//! replicas as `DeviceLoader::new` places them from the whole batch.
//!
//! Its own test binary: the multi-process device here is a trial run's (the
//! only way one process opens a rank of several here), which marks the whole process a trial.

use neuron_pc::data::{DeviceLoader, LastBatch};
use neuron_pc::topology::Topology;
use neuron_pc::{DeviceConfig, HostTensor, LazyDevice};
use neuron_pc_test_support::process::run_alone;

/// Global batch `i` of 8 rows: row `r` holds `[100 i + r; 3]`, its label `r`.
fn global(i: usize) -> Vec<HostTensor> {
    let x: Vec<f32> = (0..8).flat_map(|r| [(100 * i + r) as f32; 3]).collect();
    let y: Vec<i32> = (0..8).collect();
    vec![
        HostTensor::from_slice(&x, &[8, 3]).unwrap(),
        HostTensor::from_slice(&y, &[8]).unwrap(),
    ]
}

fn rows(batch: &[HostTensor], range: std::ops::Range<usize>) -> Vec<HostTensor> {
    batch
        .iter()
        .map(|t| {
            let per_row = t.dims()[1..].iter().product::<usize>();
            let mut dims = t.dims().to_vec();
            dims[0] = range.len();
            match t.dtype() {
                neuron_pc::DType::F32 => {
                    let v = t.to_vec::<f32>().unwrap();
                    let v = &v[range.start * per_row..range.end * per_row];
                    HostTensor::from_slice(v, &dims).unwrap()
                }
                _ => {
                    let v = t.to_vec::<i32>().unwrap();
                    let v = &v[range.start * per_row..range.end * per_row];
                    HostTensor::from_slice(v, &dims).unwrap()
                }
            }
        })
        .collect()
}

#[test]
fn each_process_reads_its_replicas_rows_and_places_them_as_the_whole_batch_would() {
    // alone in a process of its own: a trial-run device marks the whole process as a trial
    // run, and other tests' saves would be skipped
    if !run_alone(
        module_path!(),
        "each_process_reads_its_replicas_rows_and_places_them_as_the_whole_batch_would",
    ) {
        return;
    }
    // One process, two replicas: its share is every row, placed as from the whole batch.
    let dev = LazyDevice::new(DeviceConfig {
        replicas: 2,
        ..DeviceConfig::default()
    })
    .unwrap();
    assert_eq!(dev.local_rows(8).unwrap(), 0..8);
    let whole = DeviceLoader::new(&dev, (0..3).map(global), 8, LastBatch::Drop, 2);
    let mine = dev.local_rows(8).unwrap();
    let local = DeviceLoader::for_local_rows(
        &dev,
        (0..3).map(move |i| rows(&global(i), mine.clone())),
        8,
        2,
    );
    let mut n = 0;
    for (a, b) in whole.zip(local) {
        let (a, b) = (a.unwrap(), b.unwrap());
        assert_eq!((a.index, a.valid), (b.index, b.valid));
        assert_eq!(a.valid_per_replica, b.valid_per_replica);
        for (x, y) in a.tensors.iter().zip(&b.tensors) {
            let (x, y) = (x.to_host_replicas().unwrap(), y.to_host_replicas().unwrap());
            assert_eq!(x.len(), 2);
            assert_eq!(x, y);
        }
        n += 1;
    }
    assert_eq!(n, 3);
    // A source that builds the wrong number of rows is one error, not a silent drop.
    let short = DeviceLoader::for_local_rows(&dev, (0..1).map(|i| rows(&global(i), 0..6)), 8, 1)
        .next()
        .unwrap();
    let e = short.err().unwrap().to_string();
    assert!(e.contains("short of this process's 8 rows"), "{e}");

    // Rank 1 of 2 processes with two replicas each: rows 4..8 of a batch of 8, two per replica.
    let extract = std::env::temp_dir().join(format!("npc-local-rows-{}", std::process::id()));
    let rank1 = LazyDevice::new(DeviceConfig {
        replicas: 2,
        topology: Topology {
            rank: 1,
            world_size: 2,
            local_rank: 1,
            local_world_size: 2,
            ..Topology::single()
        },
        extract_dir: Some(extract.clone()),
        ..DeviceConfig::default()
    })
    .unwrap();
    assert_eq!(rank1.global_replicas(), 4);
    assert_eq!(rank1.local_rows(8).unwrap(), 4..8);
    assert_eq!(rank1.local_rows(16).unwrap(), 8..16);
    let e = rank1.local_rows(6).unwrap_err().to_string();
    assert!(e.contains("6 rows does not split over 4 replicas"), "{e}");
    let x = rank1.shard_local(&rows(&global(0), 4..8)[0]).unwrap();
    assert!(x.is_per_replica());
    assert_eq!(
        x.dims(),
        &[2, 3],
        "each replica holds 2 of the process's 4 rows"
    );
    let e = rank1
        .shard_local(&rows(&global(0), 4..7)[0])
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("over this process's 2 replicas"), "{e}");
    let _ = std::fs::remove_dir_all(extract);
}
