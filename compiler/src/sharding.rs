//! Device meshes and tensor shardings for XLA's SPMD partitioner.
//!
//! A [`Mesh`] lays the devices of a run out as an array with named axes (`data` 2 x `model` 2
//! over 4 devices). A [`PartitionSpec`] says, for each dimension of a tensor, which mesh axes it
//! is split over (none: the dimension is whole on every device), as JAX's `PartitionSpec` and
//! PyTorch/XLA's `mark_sharding` do. A [`Sharding`] is the pair checked against one tensor's
//! shape: it knows each device's block and writes the `mhlo.sharding` attribute that the
//! program's arguments and results carry, so that XLA's partitioner (run when the program is
//! compiled with `num_partitions` > 1 and `use_spmd_partitioning`) splits the computation.
//!
//! The attribute is XLA's `HloSharding` text, `{devices=[tiles..]ids}`: the tensor cut into a
//! grid of tiles, the ids (partition numbers, that is mesh positions) listed in the grid's
//! row-major order, with one more grid dimension for the mesh axes the tensor is not split over
//! (`last_tile_dim_replicate`), whose devices hold the same tile.

use crate::error::{Error, Result};
use crate::host::HostTensor;
use crate::ir::TensorType;

/// Devices laid out as an array with named axes. Position `p` of the mesh (row-major over the
/// axes) is partition `p` of a program, and runs on device `devices[p]`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Mesh {
    axes: Vec<(String, usize)>,
    devices: Vec<usize>,
}

impl Mesh {
    /// A mesh of `axes` (name, size), major first, over `devices` (ids of the client's devices),
    /// whose count must be the product of the sizes.
    pub fn new(axes: &[(&str, usize)], devices: &[usize]) -> Result<Mesh> {
        let bad = |message: String| Err(Error::Sharding { message });
        if axes.is_empty() {
            return bad("a mesh needs at least one axis".into());
        }
        for (i, (name, size)) in axes.iter().enumerate() {
            if name.is_empty() || *size == 0 {
                return bad(format!("mesh axis {i}: {name:?} of size {size}"));
            }
            if axes[..i].iter().any(|(n, _)| n == name) {
                return bad(format!("mesh axis {name:?} is named twice"));
            }
        }
        let size: usize = axes.iter().map(|(_, s)| s).product();
        if size != devices.len() {
            return bad(format!(
                "a mesh of {} needs {size} devices, {} given",
                describe(axes.iter().map(|(n, s)| (*n, *s))),
                devices.len()
            ));
        }
        if let Some(d) = devices
            .iter()
            .enumerate()
            .find(|(i, d)| devices[..*i].contains(d))
        {
            return bad(format!("device {} appears twice in the mesh", d.1));
        }
        Ok(Mesh {
            axes: axes.iter().map(|(n, s)| (n.to_string(), *s)).collect(),
            devices: devices.to_vec(),
        })
    }

    /// The number of devices.
    pub fn size(&self) -> usize {
        self.devices.len()
    }

    /// The device of each mesh position.
    pub fn devices(&self) -> &[usize] {
        &self.devices
    }

    /// The axes, major first.
    pub fn axes(&self) -> impl Iterator<Item = (&str, usize)> {
        self.axes.iter().map(|(n, s)| (n.as_str(), *s))
    }

    /// The size of axis `name`.
    pub fn axis_size(&self, name: &str) -> Option<usize> {
        self.axes.iter().find(|(n, _)| n == name).map(|(_, s)| *s)
    }

    /// The coordinate of mesh position `p` on each axis.
    fn coordinates(&self, mut p: usize) -> Vec<usize> {
        let mut c = vec![0; self.axes.len()];
        for (k, (_, size)) in self.axes.iter().enumerate().rev() {
            c[k] = p % size;
            p /= size;
        }
        c
    }

    fn axis_index(&self, name: &str) -> Option<usize> {
        self.axes.iter().position(|(n, _)| n == name)
    }
}

impl std::fmt::Display for Mesh {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&describe(self.axes()))
    }
}

fn describe<'a>(axes: impl Iterator<Item = (&'a str, usize)>) -> String {
    let parts: Vec<String> = axes.map(|(n, s)| format!("{n} {s}")).collect();
    format!("({})", parts.join(", "))
}

/// For each dimension of a tensor, the mesh axes it is split over, major first; an empty entry
/// leaves the dimension whole. Dimensions past the spec's length are whole too.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct PartitionSpec(pub Vec<Vec<String>>);

impl PartitionSpec {
    /// Whole on every device.
    pub fn replicated() -> PartitionSpec {
        PartitionSpec(Vec::new())
    }

    /// One entry per dimension: `&[&["data"], &[]]` splits dimension 0 over `data`.
    pub fn new(dims: &[&[&str]]) -> PartitionSpec {
        PartitionSpec(
            dims.iter()
                .map(|axes| axes.iter().map(|a| a.to_string()).collect())
                .collect(),
        )
    }
}

/// JAX's notation: `P('data', None)`, `P(('data', 'model'),)`.
impl std::fmt::Display for PartitionSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let dims: Vec<String> = (self.0.iter())
            .map(|axes| match axes.len() {
                0 => "None".to_string(),
                1 => format!("'{}'", axes[0]),
                _ => {
                    let quoted: Vec<String> = axes.iter().map(|a| format!("'{a}'")).collect();
                    format!("({})", quoted.join(", "))
                }
            })
            .collect();
        let trailing = if dims.len() == 1 { "," } else { "" };
        write!(f, "P({}{trailing})", dims.join(", "))
    }
}

/// A partition spec checked against a tensor's shape on a mesh.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Sharding {
    mesh: Mesh,
    spec: PartitionSpec,
    dims: Vec<usize>,
}

impl Sharding {
    /// `spec` for a tensor of `dims` on `mesh`: each axis named exists, is used once, and the
    /// product of a dimension's axes divides its size.
    pub fn new(mesh: &Mesh, spec: &PartitionSpec, dims: &[usize]) -> Result<Sharding> {
        let bad = |message: String| Err(Error::Sharding { message });
        if spec.0.len() > dims.len() {
            return bad(format!(
                "a partition spec of {} dimensions for a tensor of shape {dims:?}",
                spec.0.len()
            ));
        }
        let mut used: Vec<&str> = Vec::new();
        for (d, axes) in spec.0.iter().enumerate() {
            let mut tiles = 1;
            for a in axes {
                let Some(size) = mesh.axis_size(a) else {
                    return bad(format!(
                        "dimension {d} of shape {dims:?}: no mesh axis {a:?} in the mesh {mesh}"
                    ));
                };
                if used.contains(&a.as_str()) {
                    return bad(format!("mesh axis {a:?} splits two dimensions of {dims:?}"));
                }
                used.push(a);
                tiles *= size;
            }
            if !dims[d].is_multiple_of(tiles) {
                return bad(format!(
                    "dimension {d} of shape {dims:?} has size {}, which {} ({tiles} devices) \
                     does not divide",
                    dims[d],
                    axes.join(" x ")
                ));
            }
        }
        Ok(Sharding {
            mesh: mesh.clone(),
            spec: spec.clone(),
            dims: dims.to_vec(),
        })
    }

    /// The partition spec.
    pub fn spec(&self) -> &PartitionSpec {
        &self.spec
    }

    /// The mesh.
    pub fn mesh(&self) -> &Mesh {
        &self.mesh
    }

    /// The whole tensor's shape.
    pub fn dims(&self) -> &[usize] {
        &self.dims
    }

    /// How many tiles each dimension is cut into.
    pub fn tiles(&self) -> Vec<usize> {
        (0..self.dims.len())
            .map(|d| self.axes_of(d).map(|k| self.mesh.axes[k].1).product())
            .collect()
    }

    /// True when every device holds the whole tensor.
    pub fn is_replicated(&self) -> bool {
        self.tiles().iter().all(|&t| t == 1)
    }

    /// The shape of one device's block.
    pub fn shard_dims(&self) -> Vec<usize> {
        self.dims
            .iter()
            .zip(self.tiles())
            .map(|(d, t)| d / t)
            .collect()
    }

    /// `ty` with one device's block's shape.
    pub fn shard_type(&self, ty: &TensorType) -> TensorType {
        TensorType::new(ty.dtype, self.shard_dims())
    }

    /// The block mesh position `p` holds: its index along each dimension.
    pub fn block_of(&self, p: usize) -> Vec<usize> {
        let c = self.mesh.coordinates(p);
        (0..self.dims.len())
            .map(|d| {
                self.axes_of(d)
                    .fold(0, |idx, k| idx * self.mesh.axes[k].1 + c[k])
            })
            .collect()
    }

    /// Mesh position `p`'s block of `whole`, a tensor of this sharding's shape: what is
    /// uploaded to `p`'s device.
    pub fn block(&self, whole: &HostTensor, p: usize) -> Result<HostTensor> {
        self.check_whole(whole)?;
        let shard = self.shard_dims();
        let mut out =
            Vec::with_capacity(shard.iter().product::<usize>() * whole.dtype().size_in_bytes());
        self.for_each_run(p, whole.dtype().size_in_bytes(), |at, len| {
            out.extend_from_slice(&whole.bytes()[at..at + len])
        });
        HostTensor::from_bytes(whole.dtype(), &shard, out)
    }

    /// The whole tensor from one block per mesh position (in position order): what a read of a
    /// sharded value gathers. Of the positions that hold the same block, the first is read.
    pub fn assemble(&self, blocks: &[HostTensor]) -> Result<HostTensor> {
        let bad = |message: String| Err(Error::Sharding { message });
        if blocks.len() != self.mesh.size() {
            return bad(format!(
                "{} blocks for a mesh of {} devices",
                blocks.len(),
                self.mesh.size()
            ));
        }
        let dtype = blocks[0].dtype();
        let shard = self.shard_dims();
        if let Some((p, b)) = blocks
            .iter()
            .enumerate()
            .find(|(_, b)| b.dtype() != dtype || b.dims() != shard.as_slice())
        {
            return bad(format!(
                "block {p} is {}{:?}, the sharding's blocks are {dtype}{shard:?}",
                b.dtype(),
                b.dims()
            ));
        }
        let size = dtype.size_in_bytes();
        let mut whole = vec![0u8; self.dims.iter().product::<usize>() * size];
        let mut seen = std::collections::HashSet::new();
        for (p, b) in blocks.iter().enumerate() {
            if !seen.insert(self.block_of(p)) {
                continue;
            }
            let mut from = 0;
            self.for_each_run(p, size, |at, len| {
                whole[at..at + len].copy_from_slice(&b.bytes()[from..from + len]);
                from += len;
            });
        }
        HostTensor::from_bytes(dtype, &self.dims, whole)
    }

    fn check_whole(&self, whole: &HostTensor) -> Result<()> {
        if whole.dims() != self.dims.as_slice() {
            return Err(Error::Sharding {
                message: format!(
                    "a tensor of shape {:?} split by a sharding of shape {:?}",
                    whole.dims(),
                    self.dims
                ),
            });
        }
        Ok(())
    }

    /// Calls `f(byte offset in the whole, byte length)` for each contiguous run of position
    /// `p`'s block (one per index of its outer dimensions), in the block's row-major order.
    fn for_each_run(&self, p: usize, elem: usize, mut f: impl FnMut(usize, usize)) {
        let shard = self.shard_dims();
        let rank = self.dims.len();
        if rank == 0 {
            f(0, elem);
            return;
        }
        let start: Vec<usize> = self
            .block_of(p)
            .iter()
            .zip(&shard)
            .map(|(b, s)| b * s)
            .collect();
        // row-major strides of the whole, in elements
        let mut stride = vec![1; rank];
        for d in (0..rank - 1).rev() {
            stride[d] = stride[d + 1] * self.dims[d + 1];
        }
        let run = shard[rank - 1] * elem;
        let outer: usize = shard[..rank - 1].iter().product();
        let mut idx = vec![0; rank - 1];
        for _ in 0..outer {
            let at: usize = (0..rank)
                .map(|d| (start[d] + if d < rank - 1 { idx[d] } else { 0 }) * stride[d])
                .sum();
            f(at * elem, run);
            for d in (0..rank - 1).rev() {
                idx[d] += 1;
                if idx[d] < shard[d] {
                    break;
                }
                idx[d] = 0;
            }
        }
    }

    /// The `mhlo.sharding` attribute's value (XLA's `HloSharding` text).
    pub fn hlo(&self) -> String {
        if self.is_replicated() {
            return "{replicated}".into();
        }
        let tiles = self.tiles();
        let unused: Vec<usize> = (0..self.mesh.axes.len())
            .filter(|k| {
                !self
                    .spec
                    .0
                    .iter()
                    .flatten()
                    .any(|a| a == &self.mesh.axes[*k].0)
            })
            .collect();
        let replicas: usize = unused.iter().map(|&k| self.mesh.axes[k].1).product();
        let mut grid = tiles.clone();
        if replicas > 1 {
            grid.push(replicas);
        }
        // the id at each grid position, row-major
        let mut ids = vec![0; self.mesh.size()];
        for p in 0..self.mesh.size() {
            let c = self.mesh.coordinates(p);
            let mut at = self.block_of(p);
            if replicas > 1 {
                at.push(
                    unused
                        .iter()
                        .fold(0, |i, &k| i * self.mesh.axes[k].1 + c[k]),
                );
            }
            let flat = at.iter().zip(&grid).fold(0, |f, (i, n)| f * n + i);
            ids[flat] = p;
        }
        let list = |v: &[usize]| {
            v.iter()
                .map(|x| x.to_string())
                .collect::<Vec<_>>()
                .join(",")
        };
        format!(
            "{{devices=[{}]{}{}}}",
            list(&grid),
            list(&ids),
            if replicas > 1 {
                " last_tile_dim_replicate"
            } else {
                ""
            }
        )
    }

    /// The mesh axes (their indices) dimension `d` is split over, major first.
    fn axes_of(&self, d: usize) -> impl Iterator<Item = usize> + '_ {
        self.spec
            .0
            .get(d)
            .into_iter()
            .flatten()
            .map(|a| self.mesh.axis_index(a).expect("checked in Sharding::new"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mesh22() -> Mesh {
        Mesh::new(&[("data", 2), ("model", 2)], &[0, 1, 2, 3]).unwrap()
    }

    fn hlo(spec: &[&[&str]], dims: &[usize]) -> String {
        Sharding::new(&mesh22(), &PartitionSpec::new(spec), dims)
            .unwrap()
            .hlo()
    }

    #[test]
    fn hlo_text_as_jax_writes_it() {
        // the tile grids of jax.sharding.NamedSharding(Mesh(devices.reshape(2, 2), ("data",
        // "model")), P) for each P, read from JAX 0.10.2, written out as lists (JAX prints
        // `0,2,1,3` as `<=[2,2]T(1,0)`)
        assert_eq!(hlo(&[], &[8, 4]), "{replicated}");
        assert_eq!(hlo(&[&[], &[]], &[8, 4]), "{replicated}");
        assert_eq!(
            hlo(&[&["data"], &[]], &[8, 4]),
            "{devices=[2,1,2]0,1,2,3 last_tile_dim_replicate}"
        );
        assert_eq!(
            hlo(&[&[], &["data"]], &[8, 4]),
            "{devices=[1,2,2]0,1,2,3 last_tile_dim_replicate}"
        );
        assert_eq!(
            hlo(&[&[], &["model"]], &[8, 4]),
            "{devices=[1,2,2]0,2,1,3 last_tile_dim_replicate}"
        );
        assert_eq!(
            hlo(&[&["data"], &["model"]], &[8, 4]),
            "{devices=[2,2]0,1,2,3}"
        );
        assert_eq!(
            hlo(&[&["model"], &["data"]], &[8, 4]),
            "{devices=[2,2]0,2,1,3}"
        );
        assert_eq!(
            hlo(&[&["data", "model"]], &[8, 4]),
            "{devices=[4,1]0,1,2,3}"
        );
        assert_eq!(
            hlo(&[&["model", "data"]], &[8, 4]),
            "{devices=[4,1]0,2,1,3}"
        );
    }

    #[test]
    fn blocks_cover_the_tensor_once_per_replica() {
        let s = Sharding::new(&mesh22(), &PartitionSpec::new(&[&[], &["model"]]), &[8, 4]).unwrap();
        assert_eq!(s.shard_dims(), [8, 2]);
        let blocks: Vec<Vec<usize>> = (0..4).map(|p| s.block_of(p)).collect();
        // positions 0 and 2 (model 0) hold columns 0..2, 1 and 3 (model 1) columns 2..4
        assert_eq!(blocks, [vec![0, 0], vec![0, 1], vec![0, 0], vec![0, 1]]);
        let s = Sharding::new(
            &mesh22(),
            &PartitionSpec::new(&[&["data", "model"]]),
            &[8, 4],
        )
        .unwrap();
        assert_eq!(s.shard_dims(), [2, 4]);
        assert_eq!(
            (0..4).map(|p| s.block_of(p)[0]).collect::<Vec<_>>(),
            [0, 1, 2, 3]
        );
    }

    #[test]
    fn blocks_split_and_assemble_any_rank() {
        let m = Mesh::new(&[("data", 2), ("model", 2)], &[0, 1, 2, 3]).unwrap();
        let whole: Vec<f32> = (0..2 * 4 * 6).map(|i| i as f32).collect();
        let t = HostTensor::from_slice(&whole, &[2, 4, 6]).unwrap();
        for spec in [
            PartitionSpec::replicated(),
            PartitionSpec::new(&[&[], &["data"], &["model"]]),
            PartitionSpec::new(&[&["model"], &[], &["data"]]),
            PartitionSpec::new(&[&[], &["model", "data"]]),
            PartitionSpec::new(&[&["data"]]),
        ] {
            let s = Sharding::new(&m, &spec, &[2, 4, 6]).unwrap();
            let blocks: Vec<HostTensor> = (0..4).map(|p| s.block(&t, p).unwrap()).collect();
            for (p, b) in blocks.iter().enumerate() {
                assert_eq!(b.dims(), s.shard_dims().as_slice(), "{spec:?}");
                // the block's first element is the whole's at the block's corner
                let corner: usize = s
                    .block_of(p)
                    .iter()
                    .zip(s.shard_dims())
                    .zip([24, 6, 1])
                    .map(|((b, n), stride)| b * n * stride)
                    .sum();
                assert_eq!(b.to_vec::<f32>().unwrap()[0], corner as f32, "{spec:?} {p}");
            }
            assert_eq!(s.assemble(&blocks).unwrap().bytes(), t.bytes(), "{spec:?}");
        }
        // a scalar, and blocks that do not fit
        let s = Sharding::new(&m, &PartitionSpec::replicated(), &[]).unwrap();
        let one = HostTensor::from_slice(&[2.5f32], &[]).unwrap();
        assert_eq!(s.block(&one, 3).unwrap().bytes(), one.bytes());
        let s = Sharding::new(&m, &PartitionSpec::new(&[&["data"]]), &[2, 4, 6]).unwrap();
        let e = s
            .assemble(&[t.clone(), t.clone(), t.clone(), t.clone()])
            .unwrap_err();
        assert!(e.to_string().contains("block 0 is f32[2, 4, 6]"), "{e}");
        assert!(s.block(&one, 0).is_err());
    }

    #[test]
    fn bad_meshes_and_specs_are_one_line_naming_what() {
        let err = |r: Result<Sharding>| r.unwrap_err().to_string();
        let m = mesh22();
        let e = err(Sharding::new(
            &m,
            &PartitionSpec::new(&[&["tensor"]]),
            &[8, 4],
        ));
        assert!(
            e.contains("no mesh axis \"tensor\"") && e.contains("(data 2, model 2)"),
            "{e}"
        );
        let e = err(Sharding::new(
            &m,
            &PartitionSpec::new(&[&[], &["model"]]),
            &[8, 3],
        ));
        assert!(e.contains("dimension 1") && e.contains("size 3"), "{e}");
        let e = err(Sharding::new(
            &m,
            &PartitionSpec::new(&[&["data"], &["data"]]),
            &[8, 4],
        ));
        assert!(e.contains("\"data\" splits two dimensions"), "{e}");
        let e = err(Sharding::new(
            &m,
            &PartitionSpec::new(&[&[], &[], &[]]),
            &[8, 4],
        ));
        assert!(e.contains("3 dimensions"), "{e}");
        let e = Mesh::new(&[("data", 2), ("model", 4)], &[0, 1, 2, 3])
            .unwrap_err()
            .to_string();
        assert!(e.contains("needs 8 devices, 4 given"), "{e}");
        for e in [
            e,
            err(Sharding::new(&m, &PartitionSpec::new(&[&["x"]]), &[2])),
        ] {
            assert!(!e.contains('\n'), "{e}");
        }
        assert!(Mesh::new(&[("a", 2), ("a", 1)], &[0, 1]).is_err());
        assert!(Mesh::new(&[("a", 2)], &[1, 1]).is_err());
    }
}
