//! Compile options, serialized as XLA's `CompileOptionsProto` by a minimal protobuf writer.
//!
//! Backend options go in `env_option_overrides` (field 7): XLA applies each override to its
//! default `DebugOptions` by field name, per compilation. Sending a `DebugOptions` message
//! instead would replace the defaults wholesale (every unset field becomes zero, which breaks
//! compilation), and `XLA_FLAGS` is read once per process, so neither can vary per graph.

use std::collections::BTreeMap;

/// One backend option value (`OptionOverrideProto`).
#[derive(Clone, Debug, PartialEq)]
pub enum OverrideValue {
    /// A string value (field 1).
    Str(String),
    /// A boolean value (field 2).
    Bool(bool),
    /// An integer value (field 3).
    Int(i64),
    /// A floating-point value, sent as a 64-bit double (field 4).
    Float(f64),
}

/// What a compilation is asked to produce.
#[derive(Clone, Debug, PartialEq)]
pub struct CompileOptions {
    /// Replicas the program runs on (collectives span them).
    pub num_replicas: usize,
    /// Partitions per replica.
    pub num_partitions: usize,
    /// Partition the program with XLA's SPMD partitioner (by the `mhlo.sharding` of its
    /// arguments, results and constraints) rather than run one copy per partition.
    pub use_spmd_partitioning: bool,
    /// The device id of each (replica, partition), replica-major: replica `r`'s partition `p`
    /// runs on `device_assignment[r * num_partitions + p]` (`DeviceAssignmentProto`); empty: the
    /// plugin's default.
    pub device_assignment: Vec<usize>,
    /// `DebugOptions` fields to override by name, e.g. `xla_backend_optimization_level`.
    pub xla_overrides: BTreeMap<String, OverrideValue>,
}

impl Default for CompileOptions {
    fn default() -> Self {
        CompileOptions {
            num_replicas: 1,
            num_partitions: 1,
            use_spmd_partitioning: false,
            device_assignment: Vec::new(),
            xla_overrides: BTreeMap::new(),
        }
    }
}

impl CompileOptions {
    /// Options for an SPMD program replicated over `devices` (replica `i` on `devices[i]`).
    pub fn replicated(mut self, devices: &[usize]) -> Self {
        self.num_replicas = devices.len().max(1);
        self.device_assignment = devices.to_vec();
        self
    }

    /// Options for a program partitioned by XLA's SPMD partitioner over `devices` (partition
    /// `p`, mesh position `p`, on `devices[p]`), one replica.
    pub fn partitioned(mut self, devices: &[usize]) -> Self {
        self.num_replicas = 1;
        self.num_partitions = devices.len().max(1);
        self.use_spmd_partitioning = true;
        self.device_assignment = devices.to_vec();
        self
    }

    /// Sets one backend option.
    pub fn with_override(mut self, name: &str, value: OverrideValue) -> Self {
        self.xla_overrides.insert(name.to_string(), value);
        self
    }

    /// The serialized `CompileOptionsProto`. Deterministic (overrides in name order), so it can
    /// enter a cache key as it is.
    pub fn to_proto(&self) -> Vec<u8> {
        let mut build = Vec::new();
        put_varint_field(&mut build, 1, -1i64 as u64); // device_ordinal: not fixed
        put_varint_field(&mut build, 4, self.num_replicas as u64);
        put_varint_field(&mut build, 5, self.num_partitions as u64);
        if self.use_spmd_partitioning {
            put_varint_field(&mut build, 6, 1);
        }
        if !self.device_assignment.is_empty() {
            // DeviceAssignmentProto: replica_count (field 1), computation_count (2), then one
            // ComputationDevice (3) per partition listing its device for each replica
            // (replica_device_ids, 1)
            let partitions = self.num_partitions.max(1);
            let replicas = self.device_assignment.len() / partitions;
            let mut assignment = Vec::new();
            put_varint_field(&mut assignment, 1, replicas as u64);
            put_varint_field(&mut assignment, 2, partitions as u64);
            for p in 0..partitions {
                let mut ids = Vec::new();
                for r in 0..replicas {
                    put_varint_field(
                        &mut ids,
                        1,
                        self.device_assignment[r * partitions + p] as u64,
                    );
                }
                put_bytes_field(&mut assignment, 3, &ids);
            }
            put_bytes_field(&mut build, 9, &assignment);
        }

        let mut out = Vec::new();
        put_bytes_field(&mut out, 3, &build);
        for (name, value) in &self.xla_overrides {
            let mut v = Vec::new();
            match value {
                OverrideValue::Str(s) => put_bytes_field(&mut v, 1, s.as_bytes()),
                OverrideValue::Bool(b) => put_varint_field(&mut v, 2, *b as u64),
                OverrideValue::Int(i) => put_varint_field(&mut v, 3, *i as u64),
                OverrideValue::Float(f) => {
                    put_key(&mut v, 4, 1);
                    v.extend_from_slice(&f.to_le_bytes());
                }
            }
            let mut entry = Vec::new();
            put_bytes_field(&mut entry, 1, name.as_bytes());
            put_bytes_field(&mut entry, 2, &v);
            put_bytes_field(&mut out, 7, &entry);
        }
        out
    }
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_key(out: &mut Vec<u8>, field: u32, wire_type: u8) {
    put_varint(out, ((field as u64) << 3) | wire_type as u64);
}

fn put_varint_field(out: &mut Vec<u8>, field: u32, v: u64) {
    put_key(out, field, 0);
    put_varint(out, v);
}

fn put_bytes_field(out: &mut Vec<u8>, field: u32, bytes: &[u8]) {
    put_key(out, field, 2);
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_match_the_protobuf_encoding() {
        let mut v = Vec::new();
        put_varint(&mut v, 300);
        assert_eq!(v, [0xac, 0x02]);
        let mut n = Vec::new();
        put_varint(&mut n, -1i64 as u64);
        assert_eq!(n.len(), 10);
        assert_eq!(n[9], 0x01);
    }

    #[test]
    fn default_options_encode_build_options_only() {
        let p = CompileOptions::default().to_proto();
        // field 3, length-delimited, then device_ordinal=-1 (11 bytes), num_replicas=1,
        // num_partitions=1.
        assert_eq!(p[0], 0x1a);
        assert_eq!(p[1] as usize, p.len() - 2);
        assert_eq!(&p[p.len() - 4..], &[0x20, 0x01, 0x28, 0x01]);
    }

    #[test]
    fn partitioned_options_set_spmd_and_one_computation_per_partition() {
        let replicated = CompileOptions::default().replicated(&[0, 1]).to_proto();
        let partitioned = CompileOptions::default().partitioned(&[0, 1]).to_proto();
        assert_ne!(replicated, partitioned);
        // num_replicas 1, num_partitions 2, use_spmd_partitioning
        assert!(partitioned
            .windows(6)
            .any(|w| w == [0x20, 0x01, 0x28, 0x02, 0x30, 0x01]));
        // the assignment: replica_count 1, computation_count 2, devices [0] and [1]
        let assignment = [
            0x08, 0x01, 0x10, 0x02, 0x1a, 0x02, 0x08, 0x00, 0x1a, 0x02, 0x08, 0x01,
        ];
        assert!(partitioned.windows(12).any(|w| w == assignment));
        // replicas: one computation listing both devices, as before
        let assignment = [0x08, 0x02, 0x10, 0x01, 0x1a, 0x04, 0x08, 0x00, 0x08, 0x01];
        assert!(replicated.windows(10).any(|w| w == assignment));
    }

    #[test]
    fn overrides_are_in_name_order_and_change_the_bytes() {
        let a = CompileOptions::default()
            .with_override("b_opt", OverrideValue::Int(1))
            .with_override("a_opt", OverrideValue::Bool(true));
        let b = CompileOptions::default()
            .with_override("a_opt", OverrideValue::Bool(true))
            .with_override("b_opt", OverrideValue::Int(1));
        assert_eq!(a.to_proto(), b.to_proto());
        let c = CompileOptions::default()
            .with_override("a_opt", OverrideValue::Bool(true))
            .with_override("b_opt", OverrideValue::Int(2));
        assert_ne!(a.to_proto(), c.to_proto());
        let text = String::from_utf8_lossy(&a.to_proto()).into_owned();
        assert!(text.find("a_opt").unwrap() < text.find("b_opt").unwrap());
    }
}
