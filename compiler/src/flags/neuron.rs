//! The rest of `neuronx-cc`'s flag set: flags neuron-pc does not act on itself but must accept,
//! because existing Neuron environments put them in `NEURON_CC_FLAGS`
//! (`--distribution-strategy llm-training --enable-saturate-infinity` is common in training
//! setups). On Trainium targets they are handed to Neuron's compiler, and those that change the
//! generated code enter the cache key; on cpu and cuda they mean nothing, and a warning names
//! them once per process. A word in neither table is still refused.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Mutex;

/// What a `neuronx-cc` flag takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Arity {
    /// Given alone (`--enable-saturate-infinity`).
    Switch,
    /// Takes a value from a fixed set (case-insensitive; stored as listed here).
    OneOf(&'static [&'static str]),
    /// Takes any non-empty value (a file name).
    Any,
}

/// One `neuronx-cc` flag neuron-pc passes through.
#[derive(Clone, Copy, Debug)]
pub(crate) struct NeuronFlag {
    /// The name with hyphens, without the leading `--`.
    pub name: &'static str,
    pub arity: Arity,
    /// True when the flag changes the executable Neuron produces (so it enters the key).
    pub changes_code: bool,
    /// Its name among the cache key's flag fields.
    pub key: &'static str,
}

/// `neuronx-cc compile` flags beyond the ones [`super::CompilerFlags`] models, from Neuron's
/// compiler CLI reference.
pub(crate) const NEURON_FLAGS: &[NeuronFlag] = &[
    NeuronFlag {
        name: "distribution-strategy",
        arity: Arity::OneOf(&["llm-training", "nemo"]),
        changes_code: true,
        key: "neuron.distribution_strategy",
    },
    NeuronFlag {
        name: "logical-nc-config",
        arity: Arity::OneOf(&["1", "2"]),
        changes_code: true,
        key: "neuron.logical_nc_config",
    },
    NeuronFlag {
        name: "enable-mixed-precision-accumulation",
        arity: Arity::Switch,
        changes_code: true,
        key: "neuron.enable_mixed_precision_accumulation",
    },
    NeuronFlag {
        name: "enable-saturate-infinity",
        arity: Arity::Switch,
        changes_code: true,
        key: "neuron.enable_saturate_infinity",
    },
    NeuronFlag {
        name: "enable-fast-context-switch",
        arity: Arity::Switch,
        changes_code: true,
        key: "neuron.enable_fast_context_switch",
    },
    NeuronFlag {
        name: "enable-fast-loading-neuron-binaries",
        arity: Arity::Switch,
        changes_code: true,
        key: "neuron.enable_fast_loading_neuron_binaries",
    },
    NeuronFlag {
        name: "framework",
        arity: Arity::Any,
        changes_code: false,
        key: "neuron.framework",
    },
    NeuronFlag {
        name: "logfile",
        arity: Arity::Any,
        changes_code: false,
        key: "neuron.logfile",
    },
    NeuronFlag {
        name: "verbose",
        arity: Arity::Any,
        changes_code: false,
        key: "neuron.verbose",
    },
    NeuronFlag {
        name: "workdir",
        arity: Arity::Any,
        changes_code: false,
        key: "neuron.workdir",
    },
];

/// Looks a normalised (hyphenated) name up; `lnc` is `-lnc`, the short form of
/// `--logical-nc-config`.
pub(crate) fn lookup(name: &str) -> Option<&'static NeuronFlag> {
    let name = if name == "lnc" {
        "logical-nc-config"
    } else {
        name
    };
    NEURON_FLAGS.iter().find(|f| f.name == name)
}

/// The pass-through flags one source set, by name; a switch has no value. Ordered by name so
/// that printing, keys and arguments do not depend on the order they were written in.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct NeuronFlags(BTreeMap<String, Option<String>>);

impl NeuronFlags {
    pub(crate) fn set(&mut self, name: &str, value: Option<String>) {
        self.0.insert(name.to_string(), value);
    }

    /// True when no pass-through flag is set.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// `self` with every flag `over` sets replaced by `over`'s value.
    pub fn overlay(&self, over: &NeuronFlags) -> NeuronFlags {
        let mut out = self.clone();
        for (k, v) in &over.0 {
            out.0.insert(k.clone(), v.clone());
        }
        out
    }

    /// The code-changing flags as `(key field, value)` for the cache key (`on` for a switch).
    pub(crate) fn key_fields(&self) -> Vec<(&'static str, String)> {
        self.0
            .iter()
            .filter_map(|(k, v)| {
                let f = lookup(k).filter(|f| f.changes_code)?;
                Some((f.key, v.clone().unwrap_or_else(|| "on".into())))
            })
            .collect()
    }

    /// Every flag as `neuronx-cc` arguments (`--name [value]`).
    pub(crate) fn to_args(&self) -> Vec<String> {
        let mut args = Vec::new();
        for (k, v) in &self.0 {
            args.push(format!("--{k}"));
            args.extend(v.clone());
        }
        args
    }

    /// The flag names, as written in `NEURON_CC_FLAGS` (`--name`).
    pub fn names(&self) -> Vec<String> {
        self.0.keys().map(|k| format!("--{k}")).collect()
    }
}

/// `--name value` pairs, quoted so that the flag parser reads them back unchanged.
impl fmt::Display for NeuronFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for (k, v) in &self.0 {
            if !first {
                f.write_str(" ")?;
            }
            first = false;
            write!(f, "--{k}")?;
            if let Some(v) = v {
                write!(f, " {}", super::words::quote_word(v))?;
            }
        }
        Ok(())
    }
}

/// Names already warned about in this process.
static WARNED: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Warns once per process and flag that `flags` are Neuron compiler flags with no meaning on
/// `target`; returns the names warned about now (empty on a Neuron target or when every name was
/// warned about before).
pub(crate) fn warn_unused(flags: &NeuronFlags, target: &str) -> Vec<String> {
    let mut warned = WARNED.lock().unwrap_or_else(|p| p.into_inner());
    let new: Vec<String> = flags
        .names()
        .into_iter()
        .filter(|n| !warned.contains(n))
        .collect();
    if !new.is_empty() {
        tracing::warn!(
            "neuronx-cc flag(s) {} have no meaning on target {target}: ignored and kept out of \
             the cache key",
            new.join(", ")
        );
        warned.extend(new.iter().cloned());
    }
    new
}
