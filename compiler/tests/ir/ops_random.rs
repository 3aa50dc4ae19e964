//! Random bits: the threefry-2x32 text lowering gives the reference's exact bits on the cpu
//! plugin, for several keys and shapes.

use crate::ops_common;

use neuron_pc_compiler::ir::{Graph, Op};
use neuron_pc_compiler::reference::{self, threefry2x32};
use neuron_pc_compiler::{DType, HostTensor};
use ops_common::{check_graph, run_device, ty};

fn graph(dims: &[usize]) -> Graph {
    let mut g = Graph::new();
    let k = g.parameter(ty(DType::U32, &[2]));
    let r = g
        .push(
            Op::RandomBits {
                dims: dims.to_vec(),
            },
            &[k],
        )
        .unwrap();
    g.set_outputs(&[r]).unwrap();
    g
}

#[test]
fn device_bits_equal_reference_bits() {
    for key in [[0u32, 0], [42, 7], [u32::MAX, 0x1234_5678]] {
        for dims in [&[5][..], &[3, 4], &[2, 3, 2], &[]] {
            let g = graph(dims);
            let k = HostTensor::from_slice(&key, &[2]).unwrap();
            check_graph(&format!("random_bits {key:?} {dims:?}"), &g, &[k], 1.0);
        }
    }
}

#[test]
fn bits_follow_the_definition() {
    let g = graph(&[2, 3]);
    let key = [0x1319_8a2e, 0x0370_7344];
    let out = run_device(&g, &[HostTensor::from_slice(&key, &[2]).unwrap()]);
    let want: Vec<u32> = (0..6).map(|i| threefry2x32(key, [0, i])[0]).collect();
    assert_eq!(out[0].to_vec::<u32>().unwrap(), want);
    // Different keys give different streams; the stream looks uniform (mean of the top bit).
    let a = reference::evaluate(
        &graph(&[4096]),
        &[HostTensor::from_slice(&[1u32, 2], &[2]).unwrap()],
    )
    .unwrap();
    let b = reference::evaluate(
        &graph(&[4096]),
        &[HostTensor::from_slice(&[1u32, 3], &[2]).unwrap()],
    )
    .unwrap();
    assert_ne!(a, b);
    let high = a[0]
        .to_vec::<u32>()
        .unwrap()
        .iter()
        .filter(|&&x| x >> 31 == 1)
        .count();
    assert!((1900..2200).contains(&high), "{high}");
}
