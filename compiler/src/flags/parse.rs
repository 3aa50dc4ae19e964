//! The flag-string parser: the words of a flag string (split as a shell would, by
//! [`super::words`]) read against one table of supported flags.

use super::neuron::{self, Arity};
use super::words::split_words;
use super::{
    supported_targets, AutoCast, AutoCastType, FlagOverrides, ModelType, OptLevel, Target,
};
use crate::error::{Error, Result};

/// The flags this crate implements. Names are stored with hyphens; a user's spelling is
/// normalised (`_` to `-`) before lookup, because Neuron's compiler takes `--auto-cast` while
/// torch-neuronx reads `--retry_failed_compilation` and `--cache_dir` from the same variable, and
/// users mix both styles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Flag {
    Target,
    OptLevel,
    AutoCast,
    AutoCastType,
    ModelType,
    RetryFailed,
    CacheDir,
}

const FLAGS: &[(&str, Flag)] = &[
    ("target", Flag::Target),
    ("optlevel", Flag::OptLevel),
    ("auto-cast", Flag::AutoCast),
    ("auto-cast-type", Flag::AutoCastType),
    ("model-type", Flag::ModelType),
    ("retry-failed-compilation", Flag::RetryFailed),
    ("cache-dir", Flag::CacheDir),
];

/// One line naming every supported flag and its values, appended to every unknown-flag error.
pub(crate) fn supported_flags() -> String {
    format!(
        "supported flags: --target {{{}}}, --optlevel {{1, 2, 3}} (also O1-O3, -O1-O3), \
         --auto-cast {{{}}}, --auto-cast-type {{{}}}, --model-type {{{}}}, \
         --retry_failed_compilation, --cache_dir PATH|URL; neuronx-cc flags passed to Neuron's \
         compiler: {}",
        supported_targets(),
        AutoCast::supported(),
        AutoCastType::supported(),
        ModelType::supported(),
        neuron::NEURON_FLAGS
            .iter()
            .map(|f| format!("--{}", f.name))
            .collect::<Vec<_>>()
            .join(", ")
    )
}

fn flag_error(source: &str, what: String) -> Error {
    Error::Flag {
        message: format!("{source}: {what}; {}", supported_flags()),
    }
}

fn value_error(source: &str, flag: &str, value: &str, supported: &str) -> Error {
    Error::Flag {
        message: format!(
            "{source}: {flag} {value:?} is not supported; supported values: {supported}"
        ),
    }
}

fn lookup(name: &str) -> Option<Flag> {
    let norm = name.replace('_', "-");
    FLAGS.iter().find(|(n, _)| *n == norm).map(|&(_, f)| f)
}

pub(crate) fn parse_str(flags: &str, source: &str) -> Result<FlagOverrides> {
    let words = split_words(flags).map_err(|message| Error::Flag {
        message: format!("{source}: {message}"),
    })?;
    parse_words(&words, source)
}

/// Parses split words. `--flag value` and `--flag=value` are both accepted; a flag given twice
/// keeps its last value, as Neuron's argparse-based parser does.
pub(crate) fn parse_words<S: AsRef<str>>(words: &[S], source: &str) -> Result<FlagOverrides> {
    let mut out = FlagOverrides::default();
    let mut i = 0;
    while i < words.len() {
        let word = words[i].as_ref();
        i += 1;
        // `-lnc 2`: neuronx-cc's short form of --logical-nc-config.
        if let Some(rest) = word.strip_prefix("-lnc") {
            let inline = rest
                .strip_prefix('=')
                .or((!rest.is_empty()).then_some(rest));
            let nf = neuron::lookup("lnc").expect("in the table");
            parse_neuron(nf, "-lnc", inline, words, &mut i, source, &mut out)?;
            continue;
        }
        // `-O2` / `-O 2`: the short form of --optlevel that neuronx-cc also accepts.
        if let Some(rest) = word.strip_prefix("-O") {
            let value = if rest.is_empty() {
                let v = take_value(words, &mut i).ok_or_else(|| Error::Flag {
                    message: format!("{source}: -O needs a level (1, 2 or 3)"),
                })?;
                v.to_string()
            } else {
                rest.trim_start_matches('=').to_string()
            };
            out.opt_level = Some(parse_opt_level(source, "-O", &value)?);
            continue;
        }
        let Some(body) = word.strip_prefix("--") else {
            return Err(flag_error(
                source,
                format!("unexpected argument {word:?} (flags start with --)"),
            ));
        };
        let (name, inline) = match body.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (body, None),
        };
        let shown = format!("--{name}");
        let Some(flag) = lookup(name) else {
            let Some(nf) = neuron::lookup(&name.replace('_', "-")) else {
                return Err(flag_error(source, format!("unknown flag {shown:?}")));
            };
            parse_neuron(nf, &shown, inline, words, &mut i, source, &mut out)?;
            continue;
        };
        if flag == Flag::RetryFailed {
            out.retry_failed = Some(match inline {
                None => true,
                Some(v) => parse_bool(v).ok_or_else(|| {
                    value_error(source, &shown, v, "true, false (or give the flag alone)")
                })?,
            });
            continue;
        }
        let value = match inline {
            Some(v) => v.to_string(),
            None => take_value(words, &mut i)
                .ok_or_else(|| flag_error(source, format!("{shown} needs a value")))?
                .to_string(),
        };
        if value.is_empty() {
            return Err(flag_error(
                source,
                format!("{shown} was given an empty value"),
            ));
        }
        match flag {
            Flag::Target => {
                out.target = Some(
                    Target::from_name(&value.to_ascii_lowercase())
                        .ok_or_else(|| value_error(source, &shown, &value, &supported_targets()))?,
                )
            }
            Flag::OptLevel => out.opt_level = Some(parse_opt_level(source, &shown, &value)?),
            Flag::AutoCast => {
                out.auto_cast =
                    Some(AutoCast::from_name(&value).ok_or_else(|| {
                        value_error(source, &shown, &value, &AutoCast::supported())
                    })?)
            }
            Flag::AutoCastType => {
                out.auto_cast_type = Some(AutoCastType::from_name(&value).ok_or_else(|| {
                    value_error(source, &shown, &value, &AutoCastType::supported())
                })?)
            }
            Flag::ModelType => {
                out.model_type =
                    Some(ModelType::from_name(&value).ok_or_else(|| {
                        value_error(source, &shown, &value, &ModelType::supported())
                    })?)
            }
            Flag::CacheDir => out.cache_dir = Some(value),
            Flag::RetryFailed => {}
        }
    }
    Ok(out)
}

/// One `neuronx-cc` pass-through flag: a switch, or a value checked against its table entry.
fn parse_neuron<S: AsRef<str>>(
    nf: &neuron::NeuronFlag,
    shown: &str,
    inline: Option<&str>,
    words: &[S],
    i: &mut usize,
    source: &str,
    out: &mut FlagOverrides,
) -> Result<()> {
    let value = match (nf.arity, inline) {
        (Arity::Switch, None) => None,
        (Arity::Switch, Some(v)) => {
            return Err(flag_error(
                source,
                format!("{shown} takes no value (given {v:?})"),
            ))
        }
        (_, Some(v)) => Some(v.to_string()),
        (_, None) => Some(
            take_value(words, i)
                .ok_or_else(|| flag_error(source, format!("{shown} needs a value")))?
                .to_string(),
        ),
    };
    let value = match (nf.arity, value) {
        (_, Some(v)) if v.is_empty() => {
            return Err(flag_error(
                source,
                format!("{shown} was given an empty value"),
            ))
        }
        (Arity::OneOf(allowed), Some(v)) => Some(
            allowed
                .iter()
                .find(|a| a.eq_ignore_ascii_case(&v))
                .map(|a| a.to_string())
                .ok_or_else(|| value_error(source, shown, &v, &allowed.join(", ")))?,
        ),
        (_, v) => v,
    };
    out.neuron.set(nf.name, value);
    Ok(())
}

/// The next word as a flag's value, unless it is missing or is itself a flag.
fn take_value<'a, S: AsRef<str>>(words: &'a [S], i: &mut usize) -> Option<&'a str> {
    let w = words.get(*i)?.as_ref();
    if w.starts_with("--") || (w.starts_with("-O") && w.len() <= 3) || w.starts_with("-lnc") {
        return None;
    }
    *i += 1;
    Some(w)
}

fn parse_opt_level(source: &str, flag: &str, value: &str) -> Result<OptLevel> {
    OptLevel::from_name(value)
        .ok_or_else(|| value_error(source, flag, value, "1, 2, 3 (or O1, O2, O3)"))
}

fn parse_bool(v: &str) -> Option<bool> {
    match v.to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" => Some(true),
        "false" | "0" | "no" => Some(false),
        _ => None,
    }
}
